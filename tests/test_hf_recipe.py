"""README's "Coming from Hugging Face" recipe, run as written: a tiny random transformers Llama with its
tokenizer -> convert --from hf -> data preprocess with that tokenizer -> 20 training steps -> eval -> convert
--to hf -> transformers loads the folder and its loss and logits are cs-run's; untrained, from hf then to hf
gives the weights back bit for bit. The commands are read from README.md, so the recipe cannot rot."""

from __future__ import annotations

import glob
import re
import shlex
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from cs_run.checkpoint import load
from cs_run.frontends.cli import cli
from cs_run.summaries import read_scalars
from tests.models.hf_helpers import build
from tests.models.hf_onramp_helpers import corpus_lines, tiny_llama_folder

ROOT = Path(__file__).resolve().parents[1]
TOL = dict(rtol=1e-5, atol=1e-5)  # float32 on CPU, two implementations (see tests/models/hf_helpers.py)


def recipe_commands(readme: str) -> list[list[str]]:
    """The argument lists of the first bash block under '## Coming from Hugging Face' (continuations joined,
    comments dropped)."""
    section = readme.split("## Coming from Hugging Face\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def _run(args: list[str]) -> str:
    assert args[0] == "cs-run", args
    result = CliRunner().invoke(cli, args[1:])
    assert result.exit_code == 0, f"{shlex.join(args)} failed:\n{result.output}"
    return result.output


def _hf_eval_loss(model, shards: str, batch_size: int) -> float:
    """The Model Zoo's eval loss of the shards (in file order, whole batches): each batch's masked mean
    cross entropy, averaged over the batches."""
    data = np.concatenate([h5py.File(f)["data"][:] for f in sorted(glob.glob(f"{shards}/*.h5"))])
    losses = []
    for b in range(len(data) // batch_size):
        x = torch.from_numpy(data[b * batch_size:(b + 1) * batch_size]).long()
        ids, mask, labels = x[:, 0], x[:, 1], x[:, 2]
        with torch.no_grad():
            logits = model(input_ids=ids).logits.double()
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
        losses.append(float((ce.view_as(labels) * mask).sum() / mask.sum()))
    return float(np.mean(losses))


def test_the_readme_recipe_fine_tunes_a_hugging_face_model_and_gives_it_back(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    st = pytest.importorskip("safetensors.torch")
    commands = recipe_commands((ROOT / "README.md").read_text())
    assert [c[1:3] for c in commands] == [["checkpoint", "convert"], ["data", "preprocess"], ["train", "--params"],
                                          ["eval", "--params"], ["checkpoint", "convert"]]
    monkeypatch.chdir(tmp_path)
    tiny_llama_folder(Path("tiny_llama"))
    Path("corpus").mkdir()
    lines = corpus_lines()
    for i in range(8):
        Path(f"corpus/doc{i}.txt").write_text("\n".join(lines[i * 20:(i + 1) * 20]))
    for args in commands:
        _run(args)

    # transformers loads what --to hf wrote; its tokenizer is the one the shards were made with
    hf = transformers.AutoModelForCausalLM.from_pretrained("llama_ft").eval()
    tok = transformers.AutoTokenizer.from_pretrained("llama_ft")
    tokenizers = pytest.importorskip("tokenizers")
    text = "the lazy dog runs far away 42"
    assert tok(text)["input_ids"] == tokenizers.Tokenizer.from_file("tokenizer.json").encode(text).ids
    assert Path("llama_ft/generation_config.json").is_file()
    before = st.load_file("tiny_llama/model.safetensors")
    after = st.load_file("llama_ft/model.safetensors")
    assert any(not torch.equal(after[k], v) for k, v in before.items())  # the 20 steps changed the weights
    params = yaml.safe_load(Path("llama.yaml").read_text())
    ours = read_scalars("ft/eval")["loss"]
    assert [step for step, _ in ours] == [20]  # 20 steps from step 0
    assert abs(_hf_eval_loss(hf, "data/val", params["eval_input"]["batch_size"]) - ours[0][1]) < 1e-5

    model = build(params["model"])
    model.load_state_dict(load("ft/checkpoint_20.mdl")["model"])
    ids = torch.from_numpy(h5py.File(sorted(glob.glob("data/val/*.h5"))[0])["data"][:4, 0]).long()
    with torch.no_grad():
        torch.testing.assert_close(model.model(ids), hf(input_ids=ids).logits, **TOL)

    # untrained: --from hf then --to hf (the params found beside llama.mdl) is the same weights, bit for bit
    _run(["cs-run", "checkpoint", "convert", "llama.mdl", "round_trip", "--to", "hf"])
    original, back = (st.load_file(f"{d}/model.safetensors") for d in ("tiny_llama", "round_trip"))
    assert original.keys() == back.keys()
    for key, value in original.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert Path("round_trip", name).read_bytes() == Path("tiny_llama", name).read_bytes(), name
