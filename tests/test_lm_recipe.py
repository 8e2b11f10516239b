"""The LM recipe as a user runs it, small, on CPU: a chat JSONL -> ``cs-run data preprocess --config`` (the
Model Zoo's multi_turn_dialogue config, local paths) -> a tiny Llama fine-tuned with LoRA for 20 steps ->
DPO for 10 steps from that checkpoint -> ``checkpoint convert --to hf`` of the DPO policy -> ``cs-run
lm-eval`` on a local multiple-choice task. Each step is checked against an independent reference: the first
LoRA loss is eager PyTorch's cross entropy over the assistant tokens only (found in the chat template's
text here, not read from the shards); the first DPO loss is trl's on eager log-probabilities of the folded
LoRA weights; lm-eval's accuracies and loglikelihoods are lm-evaluation-harness' own Hugging Face backend's
on the exported folder."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from cs_run.checkpoint import load
from cs_run.frontends.cli import cli
from cs_run.lora_params import check_lora_params
from cs_run.models.common.lm import build_model
from cs_run.models.common.lora import apply_lora
from cs_run.summaries import read_scalars
from tests.lora_by_hand import folded_by_hand

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "vendor_preprocess"  # the Release_2.10.0 configs the vendor tool ran
sys.path.insert(0, str(ROOT / "tools" / "vendor_oracle"))
import preprocess_cases as pc  # noqa: E402  (the tiny byte-level BPE with a chat template)

from tests.models.test_dpo import _trl_loss  # noqa: E402  (trl's DPOTrainer loss on given log-probs)

transformers = pytest.importorskip("transformers")

MSL = 96
LLAMA = dict(name="llama", vocab_size=400, hidden_size=32, num_hidden_layers=2, num_heads=4, filter_size=64,
             max_position_embeddings=MSL, position_embedding_type="rotary", rotary_dim=8, norm_type="rmsnorm", nonlinearity="swiglu",
             share_embedding_weights=False, use_projection_bias_in_attention=False, use_ffn_bias_in_attention=False,
             use_ffn_bias=False, dropout_rate=0.0, embedding_dropout_rate=0.0, attention_dropout_rate=0.0)
BETA = 0.1
LORA = {"r": 4, "alpha": 8, "target_modules": ["TransformerDecoderLayer", "Linear"]}
SUBJECTS = ["the fox", "the dog", "a cat", "the bird", "my friend", "the teacher"]
VERBS = ["jumps", "sleeps", "runs", "sings", "reads", "waits"]
PLACES = ["in the sun", "by the river", "at home", "on the hill", "under the tree", "near the road"]


def _cs_run(*args) -> str:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, f"cs-run {' '.join(map(str, args))} failed:\n{result.output}"
    return result.output


def _chats(n: int = 32) -> list[dict]:
    """Seeded short dialogues of one or two user/assistant turns."""
    rng = random.Random(0)
    chats = []
    for _ in range(n):
        messages = []
        for _ in range(rng.choice((1, 2))):
            s, v, p = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(PLACES)
            messages += [{"role": "user", "content": f"What does {s} do?"},
                         {"role": "assistant", "content": f"{s.capitalize()} {v} {p}."}]
        chats.append({"messages": messages})
    return chats


def _pairs(n: int = 8) -> list[dict]:
    rng = random.Random(1)
    return [{"prompt": f"Where does {s} wait?", "chosen": f"{s.capitalize()} waits {p}.", "rejected": "No idea."}
            for s, p in ((rng.choice(SUBJECTS), rng.choice(PLACES)) for _ in range(n))]


def _mc_task(folder: Path) -> None:
    """A local multiple-choice task (a jsonl and its task YAML): where each subject waits, four places."""
    rng = random.Random(2)
    docs = [{"question": f"Where does {rng.choice(SUBJECTS)} wait?", "choices": rng.sample(PLACES, 4),
             "answer": rng.randrange(4)} for _ in range(12)]
    (folder / "recipe_mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "recipe_mc.yaml").write_text(
        f"task: recipe_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / 'recipe_mc.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n")


def _config(case: str, source: Path, out: Path, tok: Path, dst: Path) -> Path:
    """The Release_2.10.0 preprocessing config the vendor tool ran for ``case``, with this run's paths."""
    config = yaml.safe_load((GOLDEN / case / "config.yaml").read_text())
    config["setup"]["data"]["source"], config["setup"]["output_dir"] = str(source), str(out)
    config["processing"]["huggingface_tokenizer"] = str(tok)
    config["processing"]["max_seq_length"] = MSL
    dst.write_text(yaml.safe_dump(config))
    return dst


def _hand_sample(tokenizer, chat: dict) -> tuple[list[int], list[int], list[int]]:
    """One finetuning sample by hand: the chat template's text, tokenized once; the loss mask is 1 at the
    positions whose label (the next token) lies inside an assistant answer (its words and the eos the
    template appends), found as character spans of the rendered text."""
    text = tokenizer.apply_chat_template(chat["messages"], tokenize=False)
    spans, start = [], 0
    for message in chat["messages"]:
        if message["role"] == "assistant":
            at = text.index("<|assistant|>" + message["content"], start) + len("<|assistant|>")
            start = at + len(message["content"]) + len(tokenizer.eos_token)
            spans.append((at, start))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    scored = [int(any(a <= lo and hi <= b for a, b in spans)) for lo, hi in encoded["offset_mapping"]]
    pad = tokenizer.pad_token_id
    inputs, labels, mask = ids[:-1], ids[1:], scored[1:]
    fill = MSL - len(inputs)
    return inputs + [pad] * fill, labels + [pad] * fill, mask + [0] * fill


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """The whole recipe run once in a temp folder, as a user types it."""
    root = tmp_path_factory.mktemp("lm_recipe")
    here = os.getcwd()
    os.chdir(root)
    try:
        yield _run_recipe(root)
    finally:
        os.chdir(here)


def _run_recipe(root: Path) -> dict:
    pc.build_tokenizer(str(root))  # beside the params files: --to hf copies it into the export
    for name, records in (("chat", _chats()), ("pairs", _pairs())):
        (root / name).mkdir()
        (root / name / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    _cs_run("data", "preprocess", "--config",
            _config("multi_turn_dialogue", root / "chat", root / "sft_shards", root, root / "sft.yaml"))
    stats = json.loads((root / "sft_shards" / "data_params.json").read_text())["post-process"]
    assert stats["n_examples"] == len(_chats()), stats  # every chat fits max_seq_length: none dropped
    sft = {"train_input": {"data_processor": "GptHDF5DataProcessor", "data_dir": str(root / "sft_shards"),
                           "batch_size": 4, "shuffle": False, "num_workers": 0},
           "model": {**LLAMA, "lora_params": LORA},
           "optimizer": {"optimizer_type": "AdamW", "learning_rate": 1.0e-2, "weight_decay": 0.0},
           "runconfig": {"max_steps": 20, "log_steps": 1, "checkpoint_steps": 20, "save_initial_checkpoint": True,
                         "seed": 1}}
    (root / "lora.yaml").write_text(yaml.safe_dump(sft))
    _cs_run("train", "--params", root / "lora.yaml", "--model_dir", root / "lora")

    dpo_config = _config("dpo", root / "pairs", root / "dpo_shards", root, root / "prefs.yaml")
    config = yaml.safe_load(dpo_config.read_text())
    config["dataset"]["max_prompt_length"] = MSL // 2  # the prompts whole
    dpo_config.write_text(yaml.safe_dump(config))
    _cs_run("data", "preprocess", "--config", dpo_config)
    dpo = {"train_input": {"data_processor": "DpoHDF5DataProcessor", "data_dir": str(root / "dpo_shards"),
                           "batch_size": 4, "shuffle": False, "num_workers": 0},
           "model": {"name": "dpo", "dpo": {"beta": BETA}, "policy_model": LLAMA},
           "optimizer": {"optimizer_type": "AdamW", "learning_rate": 1.0e-3, "weight_decay": 0.0},
           "runconfig": {"max_steps": 10, "log_steps": 1, "checkpoint_steps": 10, "seed": 1}}
    (root / "dpo.yaml").write_text(yaml.safe_dump(dpo))
    _cs_run("train", "--params", root / "dpo.yaml", "--model_dir", root / "dpo",
            "--checkpoint_path", root / "lora" / "checkpoint_20.mdl")

    _cs_run("checkpoint", "convert", root / "dpo" / "checkpoint_10.mdl", root / "policy_hf", "--to", "hf")
    (root / "tasks").mkdir()
    _mc_task(root / "tasks")
    _cs_run("lm-eval", "--params", root / "dpo.yaml", "--checkpoint_path", root / "dpo" / "checkpoint_10.mdl",
            "--tokenizer", root / "policy_hf", "--tasks", "recipe_mc", "--include_path", root / "tasks",
            "--output_path", root / "lm_eval.json")
    return {"root": root}


def test_the_first_lora_loss_is_cross_entropy_over_the_assistant_tokens_by_hand(recipe):
    """Step 1's logged loss is the initial weights' (checkpoint_0) masked mean cross entropy of the first
    batch (the first 4 chats, unshuffled) by eager PyTorch, the mask built from the chat template's
    assistant spans; the shards hold those very tokens and mask (so the processor's loss mask is the
    assistant tokens')."""
    import h5py  # noqa: PLC0415

    root = recipe["root"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(root))
    hand = [_hand_sample(tokenizer, chat) for chat in _chats()[:4]]
    ids, labels, mask = (torch.tensor([h[i] for h in hand]) for i in range(3))
    shard = np.concatenate([h5py.File(f)["data"][:] for f in sorted((root / "sft_shards").glob("*.h5"))])
    assert np.array_equal(shard[:4, 0], ids.numpy()) and np.array_equal(shard[:4, 2], labels.numpy())
    assert np.array_equal(shard[:4, 1], mask.numpy())
    assert 0 < int(mask.sum()) < int((ids != tokenizer.pad_token_id).sum())  # prompts are left out of the loss

    model = build_model(**{k: v for k, v in LLAMA.items() if k != "name"})
    apply_lora(model, check_lora_params(LORA))
    model.load_state_dict(load(str(root / "lora" / "checkpoint_0.mdl"))["model"])
    with torch.no_grad():
        logits = model.model(ids).double()
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
    expected = float((ce * mask).sum() / mask.sum())
    losses = read_scalars(root / "lora" / "train")["loss"]
    assert [s for s, _ in losses] == list(range(1, 21))
    assert abs(losses[0][1] - expected) < 1e-5, (losses[0][1], expected)  # float32 forward vs float64 sum
    assert losses[-1][1] < losses[0][1]


def _sequence_logps(lm, ids, labels, mask) -> torch.Tensor:
    """Each row's summed log-probability of its label tokens under the loss mask, by eager PyTorch."""
    with torch.no_grad():
        logprobs = torch.log_softmax(lm.model(ids).double(), dim=-1)
    return (logprobs.gather(-1, labels.unsqueeze(-1)).squeeze(-1) * mask).sum(-1)


def test_dpo_starts_from_the_lora_model_and_its_first_loss_is_trls(recipe):
    """The DPO run starts from the LoRA checkpoint (adapters folded): step 1's loss is trl's DPO loss on the
    eager log-probabilities of the first batch (4 pairs, unshuffled) under those weights, for the policy and
    the reference alike, within 1e-6; its logged policy log-probs are those, within 1e-4."""
    import h5py  # noqa: PLC0415

    root = recipe["root"]
    lm = build_model(**{k: v for k, v in LLAMA.items() if k != "name"}).eval()
    lm.load_state_dict(folded_by_hand(root / "lora" / "checkpoint_20.mdl", LORA))
    rows = np.concatenate([h5py.File(f)["data"][:] for f in sorted((root / "dpo_shards").glob("*.h5"))])[:4]
    rows = torch.from_numpy(rows).long()
    chosen, rejected = (_sequence_logps(lm, rows[:, i], rows[:, i + 2], rows[:, i + 1]) for i in (0, 3))
    lengths = [torch.ones(4, dtype=torch.long)] * 2
    expected = _trl_loss("sigmoid", BETA, chosen, rejected, chosen.clone(), rejected.clone(), *lengths)
    train = read_scalars(root / "dpo" / "train")
    losses = train["loss"]
    assert [s for s, _ in losses] == list(range(1, 11))
    assert abs(losses[0][1] - expected) < 1e-6, (losses[0][1], expected)
    for tag, value in (("policy_chosen_logps", chosen), ("policy_rejected_logps", rejected)):
        logged = dict(train[tag])[1]
        assert abs(logged - float(value.mean())) < 1e-4 * abs(float(value.mean())), (tag, logged, float(value.mean()))
    assert losses[-1][1] < losses[0][1]


def test_lm_eval_of_the_dpo_policy_equals_lm_eval_s_hugging_face_backend_on_the_export(recipe):
    """``cs-run lm-eval`` on the DPO checkpoint (its policy) and lm-evaluation-harness' own HFLM on the folder
    ``convert --to hf`` wrote: the same accuracies, and each choice's loglikelihood within 1e-4 (float32, two
    implementations of the forward)."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM  # noqa: PLC0415

    from cs_run.frontends.generate_cli import load_decoder, load_tokenizer  # noqa: PLC0415
    from cs_run.frontends.lm_eval_cli import make_lm  # noqa: PLC0415

    root = recipe["root"]
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    manager = lm_eval.tasks.TaskManager(include_path=str(root / "tasks"))

    def evaluate(model):
        return lm_eval.simple_evaluate(model=model, tasks=["recipe_mc"], task_manager=manager, log_samples=True,
                                       random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0,
                                       bootstrap_iters=0)

    theirs = evaluate(HFLM(pretrained=str(root / "policy_hf"), dtype="float32", device="cpu", batch_size=1))
    lm, _ = load_decoder(root / "dpo.yaml", root / "dpo" / "checkpoint_10.mdl")  # what the command evaluates
    tok, eos = load_tokenizer(root / "policy_hf")
    ours = evaluate(make_lm(lm, tok, eos, None, batch_size=4))
    command = json.loads((root / "lm_eval.json").read_text())["results"]["recipe_mc"]
    for metric in ("acc,none", "acc_norm,none"):
        assert command[metric] == ours["results"]["recipe_mc"][metric] == theirs["results"]["recipe_mc"][metric]
    a, b = ours["samples"]["recipe_mc"], theirs["samples"]["recipe_mc"]
    assert [s["doc_id"] for s in a] == [s["doc_id"] for s in b] and len(a) == 12
    for x, y in zip(a, b):
        got, expected = ([r[0][0] for r in s["resps"]] for s in (x, y))
        assert got == pytest.approx(expected, abs=1e-4), (x["doc_id"], got, expected)
