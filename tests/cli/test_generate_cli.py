"""``cs-run generate``: a checkpoint, its params and a tokenizer give the tokens models/common/generate.py
gives for the same prompts (greedy, eos ids from the tokenizer folder, stop strings, sampling from the params'
inference keys); bad inputs are one ``Error:`` line each, with exit 2 (input) or 1 (a checkpoint that fails)."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml
from click.testing import CliRunner

from cs_run.checkpoint import save
from cs_run.frontends.cli import cli
from cs_run.models.common.generate import GenerationConfig, generate
from cs_run.models.common.lm import build_model

tokenizers = pytest.importorskip("tokenizers")

V = 40
WORDS = ["<eos>"] + [f"w{i}" for i in range(1, V)]
KEYS = dict(name="llama", vocab_size=V, hidden_size=32, num_heads=4, num_hidden_layers=2, filter_size=48,
            max_position_embeddings=32, position_embedding_type="rotary", rotary_dim=8, norm_type="rmsnorm",
            nonlinearity="swiglu", dropout_rate=0.0)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """params.yaml, model.mdl, and a word-level tokenizer folder (eos id 0 in its config.json)."""
    root = tmp_path_factory.mktemp("generate")
    torch.manual_seed(0)
    model = build_model(**{k: v for k, v in KEYS.items() if k != "name"})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    save({"model": model.state_dict()}, str(root / "model.mdl"))
    (root / "params.yaml").write_text(yaml.safe_dump({"model": KEYS}))
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<eos>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    (root / "tok").mkdir()
    tok.save(str(root / "tok" / "tokenizer.json"))
    (root / "tok" / "config.json").write_text(json.dumps({"eos_token_id": 0}))
    return root, model.model.eval(), tok


def _run(files, *args):
    root = files[0]
    return CliRunner().invoke(cli, ["generate", "--params", str(root / "params.yaml"), "--checkpoint_path",
                                    str(root / "model.mdl"), "--tokenizer", str(root / "tok"), *map(str, args)])


def _lines(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_generate_prints_the_library_s_tokens_and_text(files):
    _, lm, tok = files
    prompts = ["w5 w17 w3", "w12"]
    result = _run(files, "--prompt", prompts[0], "--prompt", prompts[1], "--max_new_tokens", 8)
    expected = generate(lm, [tok.encode(p).ids for p in prompts],
                        GenerationConfig(max_new_tokens=8, eos_token_ids=(0,)), tok.decode)
    lines = _lines(result)
    assert [(d["prompt"], d["tokens"], d["text"], d["finish_reason"]) for d in lines] == \
        [(p, g.tokens, g.text, g.finish_reason) for p, g in zip(prompts, expected)]
    assert all(w in WORDS for d in lines for w in d["text"].split())


def test_prompt_file_stop_string_and_the_params_sampling_keys(files, tmp_path):
    root, lm, tok = files
    (tmp_path / "prompts.txt").write_text("w5 w17 w3\n\nw9 w9\n")
    greedy = _lines(_run(files, "--prompt_file", tmp_path / "prompts.txt", "--max_new_tokens", 8))
    assert [d["prompt"] for d in greedy] == ["w5 w17 w3", "w9 w9"]
    words = greedy[0]["text"].split()
    stop = " ".join(words[2:4])
    stopped = _lines(_run(files, "--prompt", "w5 w17 w3", "--max_new_tokens", 8, "--stop", stop))[0]
    assert stopped["finish_reason"] == "stop_string" and stopped["text"] == greedy[0]["text"][:greedy[0]["text"].index(stop)]
    params = tmp_path / "sampling.yaml"
    params.write_text(yaml.safe_dump({"model": {**KEYS, "top_k": 3, "temperature": 0.8, "max_tokens": 6}}))
    sampled = _lines(CliRunner().invoke(cli, ["generate", "--params", str(params), "--checkpoint_path",
                                              str(root / "model.mdl"), "--tokenizer", str(root / "tok" / "tokenizer.json"),
                                              "--prompt", "w5 w17 w3", "--seed", "4"]))[0]
    expected = generate(lm, [tok.encode("w5 w17 w3").ids], GenerationConfig(
        max_new_tokens=6, do_sample=True, top_k=3, temperature=0.8, seed=4), tok.decode)[0]
    assert sampled["tokens"] == expected.tokens  # a bare tokenizer.json: no eos ids


@pytest.mark.parametrize("change, message, code", [
    (dict(params="missing.yaml"), "--params: .*missing.yaml not found", 2),
    (dict(checkpoint="missing.mdl"), "--checkpoint_path: .*missing.mdl not found", 1),
    (dict(tokenizer="nothing"), "--tokenizer: .*nothing not found; give a tokenizer.json", 2),
    (dict(tokenizer="bad.json"), "--tokenizer: .*bad.json is not a tokenizers JSON file", 2),
    (dict(prompt=[]), "give --prompt TEXT or --prompt_file F", 2),
    (dict(prompt=["w1 " * 30]), r"prompt 0: 30 tokens plus max_new_tokens 4 pass the model's "
                                r"max_position_embeddings \(32\)", 2),
    (dict(params="fc.yaml"), "model.name 'fc_mnist' is not a decoder language model", 2),
    (dict(params="other.yaml"), "checkpoint .*model.mdl does not match the params' model", 1),
    (dict(params="noname.yaml"), "no model: section with a name", 2),
])
def test_bad_inputs_are_one_error_line(files, tmp_path, change, message, code):
    root = files[0]
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "fc.yaml").write_text(yaml.safe_dump({"model": {"name": "fc_mnist", "depth": 1, "hidden_size": 8}}))
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({"model": {**KEYS, "hidden_size": 64}}))
    (tmp_path / "noname.yaml").write_text(yaml.safe_dump({"train_input": {}}))
    params = tmp_path / change["params"] if "params" in change else root / "params.yaml"
    checkpoint = tmp_path / change["checkpoint"] if "checkpoint" in change else root / "model.mdl"
    tokenizer = tmp_path / change["tokenizer"] if "tokenizer" in change else root / "tok"
    prompts = [a for p in change.get("prompt", ["w1 w2"]) for a in ("--prompt", p)]
    result = CliRunner().invoke(cli, ["generate", "--params", str(params), "--checkpoint_path", str(checkpoint),
                                      "--tokenizer", str(tokenizer), "--max_new_tokens", "4", *prompts])
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == code, result.output
    assert len(errors) == 1 and re.search(message, errors[0]), result.output


def test_zero_sampling_keys_in_the_params_mean_greedy_as_in_the_model_zoo(files, tmp_path):
    root = files[0]
    greedy = _lines(_run(files, "--prompt", "w5 w17 w3", "--max_new_tokens", 6))[0]["tokens"]
    params = tmp_path / "zeros.yaml"
    params.write_text(yaml.safe_dump({"model": {**KEYS, "temperature": 0, "top_k": 0, "top_p": None}}))
    for seed in ("1", "2"):
        got = _lines(CliRunner().invoke(cli, ["generate", "--params", str(params), "--checkpoint_path",
                                              str(root / "model.mdl"), "--tokenizer", str(root / "tok"), "--prompt",
                                              "w5 w17 w3", "--max_new_tokens", "6", "--seed", seed]))[0]
        assert got["tokens"] == greedy
