"""``cs-run lm-eval`` / cs_run.frontends.lm_eval_cli.make_lm against lm-evaluation-harness' own Hugging Face
backend (model type ``hf`` on the local transformers folder) on the same weights: a tiny random cs-run Llama
exported with ``--to hf``, a word-level tokenizer saved beside it, and three local tasks (jsonl datasets,
task YAMLs through include_path, nothing downloaded): multiple choice (accuracies equal, each choice's
loglikelihood within 1e-4), rolling loglikelihood (documents longer than the model's 32 positions, so
several windows) and generate_until (the same strings)."""

from __future__ import annotations

import json
import os
import random
import re

import pytest
import torch
import yaml
from click.testing import CliRunner
from hf_helpers import cs_run_weights_as_transformers

lm_eval = pytest.importorskip("lm_eval")
lm_eval_tasks = pytest.importorskip("lm_eval.tasks")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from cs_run.frontends.cli import cli  # noqa: E402
from cs_run.frontends.lm_eval_cli import make_lm  # noqa: E402

V = 61
WORDS = ["<pad>", "<unk>", "<eos>"] + [f"w{i}" for i in range(3, V)]  # LlamaConfig's eos_token_id is 2
LLAMA = ("LlamaConfig", "LlamaForCausalLM", "llama",
         dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False))


def _words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(3, V)}" for _ in range(n))


def _tasks(folder) -> None:
    rng = random.Random(0)
    mc = [{"question": _words(rng, rng.randrange(2, 8)), "choices": [_words(rng, rng.randrange(1, 4)) for _ in range(4)],
           "answer": rng.randrange(4)} for _ in range(12)]
    rolling = [{"text": _words(rng, rng.randrange(40, 80))} for _ in range(3)]
    gen = [{"question": _words(rng, rng.randrange(3, 9)), "answer": _words(rng, 2)} for _ in range(6)]
    common = "test_split: test\n"
    for name, docs, body in (
        ("tiny_mc", mc, "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
                        "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n"),
        ("tiny_rolling", rolling, "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
                                  "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n"),
        ("tiny_gen", gen, "output_type: generate_until\ndoc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
                          "generation_kwargs:\n  until: ['w9']\n  max_gen_toks: 6\n  do_sample: false\n"
                          "metric_list:\n  - metric: exact_match\n"),
    ):
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs))
        (folder / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n{common}{body}")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("lm_eval")
    lm, _ = cs_run_weights_as_transformers(root, *LLAMA[:3], **LLAMA[3])
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                                unk_token="<unk>")
    fast.save_pretrained(str(root / "hf"))
    (root / "tasks").mkdir()
    _tasks(root / "tasks")
    return root, lm, tokenizers.Tokenizer.from_file(str(root / "hf" / "tokenizer.json"))


def _evaluate(model, root, **kwargs):
    manager = lm_eval_tasks.TaskManager(include_path=str(root / "tasks"))
    return lm_eval.simple_evaluate(model=model, tasks=["tiny_mc", "tiny_rolling", "tiny_gen"], task_manager=manager,
                                   log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                   fewshot_random_seed=0, bootstrap_iters=0, **kwargs)


@pytest.fixture(scope="module")
def ours(setup):
    root, lm, tok = setup
    return _evaluate(make_lm(lm, tok, (2,), None, batch_size=4), root)


def test_tasks_equal_lm_eval_s_hugging_face_backend(setup, ours):
    root = setup[0]
    torch.manual_seed(0)
    theirs = _evaluate("hf", root, model_args={"pretrained": str(root / "hf"), "dtype": "float32", "device": "cpu"},
                       batch_size=1)
    for task in ("tiny_mc", "tiny_rolling", "tiny_gen"):
        a, b = ours["samples"][task], theirs["samples"][task]
        assert [s["doc_id"] for s in a] == [s["doc_id"] for s in b] and len(a) > 0
        for x, y in zip(a, b):
            if task == "tiny_gen":
                assert x["filtered_resps"] == y["filtered_resps"]
                continue
            got = [r[0][0] if isinstance(r[0], (list, tuple)) else r[0] for r in x["resps"]]
            expected = [r[0][0] if isinstance(r[0], (list, tuple)) else r[0] for r in y["resps"]]
            assert got == pytest.approx(expected, abs=1e-4)
    for metric in ("acc,none", "acc_norm,none"):
        assert ours["results"]["tiny_mc"][metric] == theirs["results"]["tiny_mc"][metric]
    assert ours["results"]["tiny_gen"]["exact_match,none"] == theirs["results"]["tiny_gen"]["exact_match,none"]
    assert ours["results"]["tiny_rolling"]["word_perplexity,none"] == pytest.approx(
        theirs["results"]["tiny_rolling"]["word_perplexity,none"], rel=1e-4)
    assert any(s["filtered_resps"][0] for s in ours["samples"]["tiny_gen"])  # some text was generated


def test_the_command_prints_the_table_and_writes_the_results(setup, ours, tmp_path):
    root = setup[0]
    (tmp_path / "params.yaml").write_text((root / "shape.yaml").read_text())
    expected = ours["results"]["tiny_mc"]["acc,none"]
    result = CliRunner().invoke(cli, ["lm-eval", "--params", str(tmp_path / "params.yaml"), "--checkpoint_path",
                                      str(root / "ours.mdl"), "--tokenizer", str(root / "hf"), "--tasks", "tiny_mc",
                                      "--include_path", str(root / "tasks"), "--eos_token_id", "2",
                                      "--output_path", str(tmp_path / "out.json")])
    assert result.exit_code == 0, result.output
    assert "tiny_mc" in result.output and "acc" in result.output
    assert json.loads((tmp_path / "out.json").read_text())["results"]["tiny_mc"]["acc,none"] == expected


def _trainer_form(root, path, **callback):
    keys = yaml.safe_load((root / "shape.yaml").read_text())["model"]
    keys["model_name"] = keys.pop("name")
    eeh = {"eeh_args": {"tasks": "tiny_mc", "num_fewshot": 0, "include_path": str(root / "tasks")},
           "tokenizer_file_path": str(root / "hf"), "eos_id": 2, "batch_size": 3, "keep_data_dir": False,
           "data_dir": "eeh", "max_sequence_length": 32, "flags": {"csx.performance.micro_batch_size": None}}
    for key, value in callback.items():
        (eeh["eeh_args"] if key in ("tasks", "apply_chat_template", "output_path") else eeh)[key] = value
    eeh = {k: v for k, v in eeh.items() if v is not None}
    path.write_text(yaml.safe_dump({"trainer": {"init": {"model": keys, "callbacks": [{"EleutherEvalHarness": eeh}]}}}))
    return path


def test_the_model_zoo_s_eleuther_eval_harness_callback_runs_from_a_trainer_form_file(setup, ours, tmp_path):
    root = setup[0]
    expected = ours["results"]["tiny_mc"]["acc,none"]
    params = _trainer_form(root, tmp_path / "eeh.yaml", output_path=str(tmp_path / "eeh_out"))
    result = CliRunner().invoke(cli, ["lm-eval", "--params", str(params), "--checkpoint_path", str(root / "ours.mdl")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "eeh_out" / "results.json").read_text())["results"]["tiny_mc"]["acc,none"] == expected


@pytest.mark.parametrize("callback, message", [
    (dict(tasks=None), r"trainer.init.callbacks\[0\].EleutherEvalHarness.eeh_args.tasks: missing"),
    (dict(apply_chat_template=True), "eeh_args.apply_chat_template: not supported by cs-run lm-eval"),
    (dict(model_parallel=True), r"EleutherEvalHarness.model_parallel: unknown key of the EleutherEvalHarness"),
    (dict(tokenizer_file_path=None, pretrained_model_name_or_path="meta-llama/Meta-Llama-3-8B"),
     "--tokenizer: meta-llama/Meta-Llama-3-8B not found; give a local tokenizer.json"),
    (dict(tokenizer_file_path=None), "--tokenizer: missing"),
])
def test_bad_callbacks_are_one_error_line(setup, tmp_path, callback, message):
    root = setup[0]
    params = _trainer_form(root, tmp_path / "eeh.yaml", **callback)
    result = CliRunner().invoke(cli, ["lm-eval", "--params", str(params), "--checkpoint_path", str(root / "ours.mdl")])
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 2, result.output
    assert len(errors) == 1 and re.search(message, errors[0]), result.output


@pytest.mark.parametrize("args, message", [
    (["--tasks", "no_such_task"], "--tasks: unknown task.s. no_such_task"),
    (["--tasks", "tiny_mc", "--tokenizer", "/nonexistent"], "--tokenizer: .*nonexistent/?.* not found"),
])
def test_bad_inputs_are_one_error_line(setup, tmp_path, args, message):
    root = setup[0]
    base = {"--params": str(root / "shape.yaml"), "--checkpoint_path": str(root / "ours.mdl"),
            "--tokenizer": str(root / "hf"), "--include_path": str(root / "tasks"), "--eos_token_id": "2"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    result = CliRunner().invoke(cli, ["lm-eval", *[x for kv in base.items() for x in kv]])
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 2, result.output
    assert len(errors) == 1 and re.search(message, errors[0]), result.output
