"""``cs-run data preprocess --config``: the vendor's own output on the same inputs is the reference.

tests/data/vendor_preprocess/ holds, per case of tools/vendor_oracle/preprocess_cases.CASES, the config
the Model Zoo's Release_2.10.0 preprocessing ran (paths as ``<IN>``/``<OUT>``/``<TOK>``), its .h5 files and
its data_params.json, recorded by tools/vendor_oracle/record_preprocess.py, with the inputs and tokenizer
it read. cs-run runs the same config on the same files; the .h5 names, arrays (exactly: ids and masks
are integers) and attributes must be equal, and data_params.json too except the keys that hold the
recording machine's paths (setup.output_dir, setup.data.source, processing.huggingface_tokenizer,
processing.tokenizer_params.encoder_file / vocab_file): they name where the files were, not what was made.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "vendor_preprocess"
sys.path.insert(0, str(ROOT / "tools" / "vendor_oracle"))
import preprocess_cases as pc  # noqa: E402

from cs_run.checkpoint import load  # noqa: E402
from cs_run.data.preprocessing.vendor_config import preprocess_config  # noqa: E402
from cs_run.data.processors.gpt_hdf5 import build_dataloader  # noqa: E402
from cs_run.errors import DataError, ParamsError  # noqa: E402
from cs_run.models.common import lm  # noqa: E402
from cs_run.params import load_params  # noqa: E402
from cs_run.runners import PyTorchBaseRunner  # noqa: E402
from cs_run.summaries import read_scalars  # noqa: E402

PATH_KEYS = [("setup", "output_dir"), ("setup", "data", "source"), ("setup", "image_dir"), ("processing", "huggingface_tokenizer"),
             ("processing", "tokenizer_params", "encoder_file"), ("processing", "tokenizer_params", "vocab_file")]


def _config(case_id: str, tmp_path: Path, out: Path) -> Path:
    """The recorded config with this test's paths filled in."""
    text = (GOLDEN / case_id / "config.yaml").read_text()
    text = text.replace("<IN>", str(GOLDEN / "inputs")).replace("<OUT>", str(out))
    text = text.replace("<TOK>", str(GOLDEN / "tokenizer")).replace(f"{out}_splits", str(tmp_path / "splits"))
    path = tmp_path / f"{case_id}.yaml"
    path.write_text(text)
    return path


def _h5(folder: Path) -> dict[str, tuple[dict, dict]]:
    import h5py

    found = {}
    for f in sorted(folder.rglob("*.h5")):  # a data split's outputs are in SPLIT/msl_N subfolders
        with h5py.File(f, "r") as h:
            found[str(f.relative_to(folder))] = (dict(h.attrs), {k: (h[k][()], h[k].dtype, h[k].chunks, h[k].maxshape)
                                                            for k in h})
    return found


def _drop_paths(params: dict) -> dict:
    for keys in PATH_KEYS:
        node = params
        for key in keys[:-1]:
            node = node.get(key, {})
        node.pop(keys[-1], None)
    return params


@pytest.mark.parametrize("case_id", [c[0] for c in pc.CASES])
def test_matches_vendor(case_id: str, tmp_path: Path) -> None:
    if "parquet" in case_id:
        pytest.importorskip("pyarrow")
    out = tmp_path / "out"
    preprocess_config(str(_config(case_id, tmp_path, out)))
    _assert_vendor_output(case_id, out)


def _assert_vendor_output(case_id: str, out: Path, ignore: tuple = ()) -> None:
    """``out`` holds what the vendor wrote for ``case_id``: the same .h5 files, arrays and attributes, and the
    same data_params.json but for the paths (and the processing keys in ``ignore``)."""
    want, got = _h5(GOLDEN / case_id), _h5(out)
    assert sorted(got) == sorted(want)
    for name, (attrs, data) in want.items():
        got_attrs, got_data = got[name]
        assert got_attrs == attrs, name
        assert sorted(got_data) == sorted(data), name
        for key, (array, dtype, chunks, maxshape) in data.items():
            assert got_data[key][1:] == (dtype, chunks, maxshape), (name, key)
            np.testing.assert_array_equal(got_data[key][0], array, err_msg=f"{name}:{key}")
    want_files = sorted(str(p.relative_to(GOLDEN / case_id)) for p in (GOLDEN / case_id).rglob("data_params.json"))
    assert sorted(str(p.relative_to(out)) for p in out.rglob("data_params.json")) == want_files
    for rel in want_files:
        want_params = _drop_paths(json.loads((GOLDEN / case_id / rel).read_text()))
        got_params = _drop_paths(json.loads((out / rel).read_text()))
        for key in ignore:
            want_params["processing"].pop(key, None), got_params["processing"].pop(key, None)
        assert got_params == want_params, rel
    assert not [p.name for p in out.rglob(".*")]  # no staging folder left


def test_cli_runs_config(tmp_path: Path) -> None:
    from cs_run.frontends.cli import cli

    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["data", "preprocess", "--config", str(_config("hf_pretraining_packed", tmp_path,
                                                                                       out))])
    assert result.exit_code == 0, result.output
    golden = GOLDEN / "hf_pretraining_packed"
    n = json.loads((golden / "data_params.json").read_text())["post-process"]["n_examples"]
    assert f"{n} samples in {len(list(golden.glob('*.h5')))} file(s)" in result.output
    assert (out / "data_params.json").is_file()


def _saved_dict(tmp_path: Path, text: str) -> str:
    """A config reading split 'test' of a saved DatasetDict that has only 'train'."""
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a b c"]})}).save_to_disk(str(tmp_path / "hf"))
    return text.replace(str(GOLDEN / "inputs" / "text"), str(tmp_path / "hf")).replace(
        "type: local", "type: huggingface\n    split: test")


def _used_splits_dir(tmp_path: Path, text: str) -> str:
    """A config whose data_splits_dir already holds a split file (a rerun would append to it)."""
    (tmp_path / "used_splits" / "train").mkdir(parents=True)
    (tmp_path / "used_splits" / "train" / "docs_jsonl.jsonl").write_text('{"text": "earlier"}\n')
    return text.replace("  processes: 1", f"  processes: 1\n  data_splits_dir: {tmp_path / 'used_splits'}\n"
                        "  data_splits: {train: {split_fraction: 1}}")


_FIM = "  training_objective: fim\n  fim_rate: 0.9\n  spm_rate: 0.5\n  fim_prefix_tok: <p>\n  fim_middle_tok: <m>\n" \
       "  fim_suffix_tok: <s>\n"

# (case id, edit of the packed case's config text or files, error type, what the one line must say)
BAD = [
    ("unknown-section", lambda t, d: t + "extra:\n  a: 1\n", ParamsError, r"extra is not a section .*yaml:\d+"),
    ("unknown-key", lambda t, d: t.replace("  seed: 0", "  sead: 0"), ParamsError,
     r"processing\.sead is not a key .*yaml:\d+\); remove it or fix its spelling"),
    ("mode-embedding-not-yet", lambda t, d: t.replace("mode: pretraining", "mode: embedding_training"), ParamsError,
     r"setup\.mode is 'embedding_training', which cs-run's --config does not run yet .*yaml:\d+"),
    ("text-hook-in-nlg", lambda t, d: t.replace("mode: pretraining", "mode: nlg"), ParamsError,
     r"read_hook '.*hooks:text_read_hook' is not a hook cs-run runs in mode nlg .*use .*hooks:nlg_read_hook"),
    ("inverted-mask-nlg", lambda t, d: t.replace("  seed: 0", "  seed: 0\n  inverted_mask: true").replace(
     "mode: pretraining", "mode: nlg"), ParamsError,
     r"processing\.inverted_mask is not run by cs-run's --config in mode 'nlg' yet .*yaml:\d+\); set it to false"),
    ("hook-of-another-mode", lambda t, d: t.replace("hooks:text_read_hook", "hooks:dpo_read_hook"), ParamsError,
     r"read_hook '.*hooks:dpo_read_hook' is not a hook cs-run runs in mode pretraining .*use .*text_read_hook"),
    ("mode-unknown", lambda t, d: t.replace("mode: pretraining", "mode: pretrain"), ParamsError,
     r"setup\.mode is 'pretrain' .*use one of pretraining"),
    ("multimodal", lambda t, d: t.replace("  pack_sequences: true", "  pack_sequences: true\n  is_multimodal: true"),
     ParamsError, r"setup\.mode is 'pretraining' with multimodal data \(image captions\) .*yaml:\d+\); cs-run's --config "
     r"runs multimodal finetuning"),
    ("bert-in-finetuning", lambda t, d: t.replace("  pack_sequences: true", "  training_objective: bert_pretraining")
     .replace("mode: pretraining", "mode: finetuning"), ParamsError,
     r"dataset\.training_objective is 'bert_pretraining' in mode 'finetuning' .*yaml:\d+\); the vendor runs "
     r"bert_pretraining in mode pretraining only"),
    ("mlm-fraction-over-one", lambda t, d: t.replace("  pack_sequences: true", "  training_objective: mlm\n"
     "  mlm_fraction: 1.5"), ParamsError, r"dataset\.mlm_fraction is 1\.5 .*yaml:\d+\); give a fraction in \(0, 1\]"),
    ("mlm-excluded-tokens-not-a-list", lambda t, d: t.replace("  pack_sequences: true", "  training_objective: mlm\n"
     "  excluded_tokens: <cls>"), ParamsError, r"dataset\.excluded_tokens is '<cls>' .*yaml:\d+\); give a list"),
    ("mlm-with-shuffle", lambda t, d: t.replace("  pack_sequences: true", "  training_objective: mlm").replace(
     "  shuffle: false", "  shuffle: true"), ParamsError,
     r"processing\.shuffle is not run by cs-run's --config with training_objective mlm yet .*yaml:\d+\); set it"),
    ("mlm-tokenizer-without-mask", lambda t, d: t.replace("  pack_sequences: true", "  training_objective: mlm"),
     ParamsError, r"training_objective mlm needs the tokenizer's mask_token \(.*yaml:\d+\); name it"),
    ("msl-type", lambda t, d: t.replace("max_seq_length: 16", "max_seq_length: sixteen"), ParamsError,
     r"processing\.max_seq_length is 'sixteen' .*yaml:\d+\); give an integer"),
    ("tokenizer-hub-name", lambda t, d: t.replace(str(GOLDEN / "tokenizer"), "tiiuae/falcon-7b"), ParamsError,
     r"huggingface_tokenizer is 'tiiuae/falcon-7b', not a local folder .*downloads nothing"),
    ("source-missing", lambda t, d: t.replace(str(GOLDEN / "inputs"), "/nonexistent"), ParamsError,
     r"setup\.data\.source is '/nonexistent/text', not a folder"),
    ("hook-unknown", lambda t, d: t.replace("hooks:text_read_hook", "hooks:my_hook"), ParamsError,
     r"read_hook '.*hooks:my_hook' is not a hook cs-run runs .*yaml:\d+"),
    ("ftfy-missing", lambda t, d: t.replace("use_ftfy: false", "use_ftfy: true"), ParamsError,
     r"use_ftfy is true but the ftfy package is not installed"),
    ("wikitext-in-finetuning", lambda t, d: t.replace("wikitext_detokenize: false", "wikitext_detokenize: true")
     .replace("mode: pretraining", "mode: finetuning"), ParamsError,
     r"processing\.wikitext_detokenize is not run by cs-run's --config in mode 'finetuning' yet .*yaml:\d+\); set it"),
    ("data-splits-sum", lambda t, d: t.replace("  processes: 1", "  processes: 1\n  data_splits: {train: "
     "{split_fraction: 0.8}, val: {split_fraction: 0.3}}"), ParamsError,
     r"setup\.data_splits fractions add up to 1\.1\d* .*yaml:\d+\); make the split_fraction values add up to 1"),
    ("context-splits-no-fractions", lambda t, d: t.replace("  processes: 1", "  processes: 1\n  context_splits: "
     "{MSL_List: [1K]}"), ParamsError, r"setup\.context_splits\.split_fractions is None .*yaml:\d+\); give 1 fractions"),
    ("context-splits-twice", lambda t, d: t.replace("  processes: 1", "  processes: 1\n  context_splits: {MSL_List: "
     "[1K], split_fractions: [1]}\n  data_splits: {train: {split_fraction: 1, context_splits: {MSL_List: [2K], "
     "split_fractions: [1]}}}"), ParamsError, r"setup\.context_splits is given with data_splits\.train\.context_splits"),
    ("msl-list-repeats", lambda t, d: t.replace("  processes: 1", "  processes: 1\n  context_splits: {MSL_List: "
     "[1K, 1024], split_fractions: [1, 1]}"), ParamsError, r"setup\.context_splits\.MSL_List repeats a length"),
    ("splits-processes", lambda t, d: t.replace("  processes: 1", "  processes: 2\n  context_splits: {MSL_List: "
     "[1K], split_fractions: [1]}"), ParamsError, r"setup\.processes is 2 with data splits .*yaml:\d+\); set it to 1"),
    ("splits-dir-not-empty", lambda t, d: _used_splits_dir(d, t), ParamsError,
     r"setup\.data_splits_dir .*used_splits already holds files .*yaml:\d+\); give an empty or new folder"),
    ("hf-not-saved", lambda t, d: t.replace("type: local", "type: huggingface\n    split: train"), ParamsError,
     r"setup\.data\.source is '.*/text', not a folder written by save_to_disk .*yaml:\d+\); cs-run downloads nothing"),
    ("hf-split-not-saved", lambda t, d: _saved_dict(d, t), ParamsError,
     r"setup\.data\.split is 'test', not a split of the saved DatasetDict .*yaml:\d+\); give one of train"),
    ("inverted-mask-dpo", lambda t, d: t.replace("  seed: 0", "  seed: 0\n  inverted_mask: true").replace(
     "mode: pretraining", "mode: dpo"), ParamsError,
     r"processing\.inverted_mask is not run by cs-run's --config in mode 'dpo' yet .*yaml:\d+\); set it to false"),
    ("token-limit-negative", lambda t, d: t.replace("  seed: 0", "  seed: 0\n  token_limit: -5"), ParamsError,
     r"processing\.token_limit is -5 .*yaml:\d+\); give a positive integer"),
    ("token-limit-string", lambda t, d: t.replace("  seed: 0", "  seed: 0\n  token_limit: 10M"), ParamsError,
     r"processing\.token_limit is '10M' .*yaml:\d+\); give a positive integer"),
    ("token-limit-true", lambda t, d: t.replace("  seed: 0", "  seed: 0\n  token_limit: true"), ParamsError,
     r"processing\.token_limit is True .*yaml:\d+\); give a positive integer"),
    ("shuffle-seed-string", lambda t, d: t.replace("shuffle: false", "shuffle: true").replace(
     "shuffle_seed: 0", "shuffle_seed: abc"), ParamsError, r"processing\.shuffle_seed is 'abc' .*yaml:\d+\); give an integer"),
    ("shuffle-seed-negative", lambda t, d: t.replace("shuffle: false", "shuffle: true").replace(
     "shuffle_seed: 0", "shuffle_seed: -3"), ParamsError, r"processing\.shuffle_seed is -3 .*yaml:\d+\); give an integer >= 0"),
    ("shuffle-not-bool", lambda t, d: t.replace("shuffle: false", "shuffle: sometimes"), ParamsError,
     r"processing\.shuffle is 'sometimes' .*yaml:\d+\); give true or false"),
    ("vsl-not-bool", lambda t, d: t.replace("  pack_sequences: true", "  use_vsl: 1"), ParamsError,
     r"dataset\.use_vsl is 1 .*yaml:\d+\); give true or false"),
    ("vsl-dpo", lambda t, d: t.replace("  pack_sequences: true", "  use_vsl: true").replace("mode: pretraining",
     "mode: dpo"), ParamsError, r"dataset\.use_vsl is true with mode 'dpo'.*yaml:\d+\); set use_vsl to false"),
    ("vsl-fim", lambda t, d: t.replace("  pack_sequences: true", _FIM + "  use_vsl: true"), ParamsError,
     r"dataset\.use_vsl is true with training_objective 'fim'.*yaml:\d+\); set use_vsl to false"),
    ("vsl-inverted-mask", lambda t, d: t.replace("  pack_sequences: true", "  use_vsl: true").replace(
     "  seed: 0", "  seed: 0\n  inverted_mask: true"), ParamsError,
     r"processing\.inverted_mask is not run by cs-run's --config with dataset\.use_vsl yet .*yaml:\d+\)"),
    ("bad-json-line", None, DataError, r"bad\.jsonl:2 is not a JSON line"),
    ("fim-rate-missing", lambda t, d: t.replace("  pack_sequences: true", "  training_objective: fim"), ParamsError,
     r"dataset\.fim_rate is None .*; give a probability in \[0, 1\]"),
    ("fim-rate-over-one", lambda t, d: t.replace("  pack_sequences: true", _FIM.replace("0.9", "1.5")), ParamsError,
     r"dataset\.fim_rate is 1\.5 .*yaml:\d+\); give a probability"),
    ("fim-token-missing", lambda t, d: t.replace("  pack_sequences: true", _FIM.replace("  fim_suffix_tok: <s>\n", "")),
     ParamsError, r"dataset\.fim_suffix_tok is missing .*yaml"),
    ("fim-token-not-in-tokenizer", lambda t, d: t.replace("  pack_sequences: true", _FIM), ParamsError,
     r"the FIM token '<p>' is not in the tokenizer \(.*yaml:\d+\); add it"),
    ("fim-in-finetuning", lambda t, d: t.replace("  pack_sequences: true", _FIM).replace("mode: pretraining",
     "mode: finetuning"), ParamsError, r"dataset\.training_objective is 'fim' in mode 'finetuning' .*yaml:\d+"),
]


# (case id, recorded case whose config reads the line, input folder, the bad line, what the one line must say)
BAD_RECORDS = [
    ("text-not-a-string", "hf_pretraining_packed", "text", '{"text": {"a": 1}}',
     r"docs2\.jsonl:2 does not have the shape the read hook text_read_hook reads \(AttributeError"),
    ("chat-turn-not-a-mapping", "multi_turn_dialogue", "chat", '{"messages": ["hi", "there"]}',
     r"docs2\.jsonl:2 does not have the shape the read hook chat_read_hook reads \(AttributeError"),
    ("dpo-list-too-short", "dpo_chat_lists", "dpo_chat", '{"chosen": [{"content": "q"}], "rejected": [{"content": "q"}]}',
     r"docs2\.jsonl:2 does not have the shape the read hook dpo_read_hook reads \(IndexError"),
    ("completion-a-list", "summarization", "prompt_completion", '{"prompt": "p", "completion": ["a"]}',
     r"docs2\.jsonl:2 has a list where prompt_completion_text_read_hook reads text"),
    # mode nlg reads token id lists: where the vendor's arithmetic raises or makes a meaningless row, one line
    ("nlg-context-text", "nlg", "nlg", '{"context": "name: The Eagle", "completion": [5, 0]}',
     r"docs2\.jsonl:2 has context 'name: The Eagle', not a list of token ids; mode nlg reads pre-tokenized"),
    ("nlg-completion-missing", "nlg", "nlg", '{"context": [5, 6]}',
     r"docs2\.jsonl:2 has no completion \(read_hook_kwargs\.completion_key names the record's key\)"),
    ("nlg-empty-completion", "nlg", "nlg", '{"context": [5, 6], "completion": []}',
     r"docs2\.jsonl:2 has an empty completion; mode nlg needs at least one completion token"),
    ("nlg-over-msl", "nlg", "nlg", '{"context": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], "completion": [1, 2, 3, 4, 5, 0, 7]}',
     r"docs2\.jsonl:2 has 11 context and 7 completion tokens, 17 inputs over max_seq_length 16 .*raise "
     r"processing\.max_seq_length"),
    ("nlg-id-outside-vocab", "nlg", "nlg", '{"context": [5, 400], "completion": [0]}',
     r"docs2\.jsonl:2 has context token id 400, outside the tokenizer's vocabulary \(0\.\.399\)"),
    ("nlg-float-ids", "nlg", "nlg", '{"context": [5.0, 6.0], "completion": [0]}',
     r"docs2\.jsonl:2 has context \[5\.0, 6\.0\], not a list of token ids"),
]


@pytest.mark.parametrize("case_id,golden,folder,line,message", BAD_RECORDS, ids=[b[0] for b in BAD_RECORDS])
def test_bad_record_is_one_line(case_id, golden, folder, line, message, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    shutil.copytree(GOLDEN / "inputs", inputs)
    first = (inputs / folder).glob("*.jsonl").__next__().read_text().splitlines()[0]
    (inputs / folder / "docs2.jsonl").write_text(first + "\n" + line + "\n")
    out = tmp_path / "out"
    config = _config(golden, tmp_path, out)
    config.write_text(config.read_text().replace(str(GOLDEN / "inputs"), str(inputs)))
    with pytest.raises(DataError, match=message) as info:
        preprocess_config(str(config))
    assert "\n" not in str(info.value)
    assert not out.exists() or not [p for p in out.iterdir()]


@pytest.mark.parametrize("case_id,edit,kind,message", BAD, ids=[b[0] for b in BAD])
def test_bad_config_is_one_line(case_id, edit, kind, message, tmp_path: Path) -> None:
    if case_id == "ftfy-missing" and _has("ftfy"):
        pytest.skip("ftfy is installed here: use_ftfy true runs")
    if case_id.startswith("hf-") and not _has("datasets"):
        pytest.skip("datasets is not installed: type huggingface is refused as such")
    out = tmp_path / "out"
    config = _config("hf_pretraining_packed", tmp_path, out)
    text = config.read_text()
    if edit is None:  # a damaged input line: the inputs are a copy with one bad line
        inputs = tmp_path / "inputs"
        shutil.copytree(GOLDEN / "inputs", inputs)
        (inputs / "text" / "bad.jsonl").write_text('{"text": "fine line of text here"}\n{"text": oops}\n')
        text = text.replace(str(GOLDEN / "inputs"), str(inputs))
    else:
        text = edit(text, tmp_path)
    config.write_text(text)
    out.mkdir()
    (out / "keep.txt").write_text("earlier work")
    with pytest.raises(kind, match=message) as info:
        preprocess_config(str(config))
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]  # nothing written, nothing lost


def test_unsafe_skip_leaves_a_bad_line_out(tmp_path: Path) -> None:
    """UNSAFE_skip_jsonl_decoding_errors: the bad line is left out, and the rest equals a run without it."""
    inputs = tmp_path / "inputs"
    shutil.copytree(GOLDEN / "inputs", inputs)
    lines = (inputs / "text" / "docs.jsonl").read_text().splitlines(keepends=True)
    (inputs / "text" / "docs.jsonl").write_text("".join(lines[:2] + ['{"text": oops}\n'] + lines[2:]))
    out = tmp_path / "out"
    config = _config("hf_pretraining_packed", tmp_path, out)
    config.write_text(config.read_text().replace(str(GOLDEN / "inputs"), str(inputs))
                      .replace("UNSAFE_skip_jsonl_decoding_errors: false", "UNSAFE_skip_jsonl_decoding_errors: true"))
    preprocess_config(str(config))
    got, want = _h5(out), _h5(GOLDEN / "hf_pretraining_packed")
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in want.items()}
    for name in want:
        np.testing.assert_array_equal(got[name][1]["data"][0], want[name][1]["data"][0])


def test_existing_output_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = _config("hf_pretraining_packed", tmp_path, out)
    preprocess_config(str(config))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ParamsError, match=r"already holds data_params\.json, output_chunk_0_1\.h5"):
        preprocess_config(str(config))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_resume(tmp_path: Path) -> None:
    """resume_from_checkpoint: a folder with no finished run starts over and matches the vendor (whose flag falls
    back the same way); a finished run is left as it is."""
    out = tmp_path / "out"
    config = _config("hf_pretraining_packed", tmp_path, out)
    config.write_text(config.read_text().replace("resume_from_checkpoint: false", "resume_from_checkpoint: true"))
    (out / ".preprocess-killed").mkdir(parents=True)  # what a kill -9 leaves: a staging folder, no output
    first = preprocess_config(str(config))
    want = _h5(GOLDEN / "hf_pretraining_packed")
    assert {k: v[0] for k, v in _h5(out).items()} == {k: v[0] for k, v in want.items()}
    assert not (out / ".preprocess-killed").exists()  # the killed run's staging folder is cleaned up
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = preprocess_config(str(config))
    assert again == first
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


@pytest.mark.parametrize("limit", ["false", "0", "null"])
def test_token_limit_false_or_zero_is_no_limit(limit: str, tmp_path: Path) -> None:
    """The vendor reads token_limit as ``if self.token_limit``: false, 0 and null write everything."""
    out = tmp_path / "out"
    config = _config("hf_pretraining_packed", tmp_path, out)
    config.write_text(config.read_text().replace("  seed: 0", f"  seed: 0\n  token_limit: {limit}"))
    preprocess_config(str(config))
    got, want = _h5(out), _h5(GOLDEN / "hf_pretraining_packed")
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name][1]["data"][0], want[name][1]["data"][0])


# A run killed by SIGKILL right after it wrote its first .h5 file (into its staging folder)
_KILLED_AFTER_FIRST_FILE = """
import os, signal, sys
from cs_run.data.preprocessing.vendor_config import _output, preprocess_config

def killed_after(write):
    def write_then_die(self, *args):
        write(self, *args)
        os.kill(os.getpid(), signal.SIGKILL)
    return write_then_die

_output.Output.write_h5 = killed_after(_output.Output.write_h5)
_output.Output.append_h5 = killed_after(_output.Output.append_h5)
preprocess_config(sys.argv[1])
"""


@pytest.mark.parametrize("case_id", ["hf_pretraining_vsl_shuffle_token_limit", "hf_pretraining_token_limit"])
def test_resume_after_a_kill_equals_one_clean_run(case_id: str, tmp_path: Path) -> None:
    """resume_from_checkpoint with shuffle, token_limit and use_vsl: a run killed mid-way leaves only its staging
    folder (shuffled files are appended to in place, so a half-written one must never be read as output); the
    resumed run starts over and writes what one clean run of the vendor's tool writes."""
    out = tmp_path / "out"
    config = _config(case_id, tmp_path, out)
    config.write_text(config.read_text().replace("resume_from_checkpoint: false", "resume_from_checkpoint: true"))
    killed = subprocess.run([sys.executable, "-c", _KILLED_AFTER_FIRST_FILE, str(config)], capture_output=True,
                            text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    staged = [p for p in out.iterdir()]
    assert len(staged) == 1 and staged[0].name.startswith(".preprocess-") and list(staged[0].glob("*.h5"))
    preprocess_config(str(config))
    _assert_vendor_output(case_id, out, ignore=("resume_from_checkpoint",))


RELEASE_CONFIGS = [  # Release_2.10.0 src/cerebras/modelzoo/data_preparation/data_preprocessing/configs/
    "autoregressive_lm_preprocessing.yaml", "bert_pretraining_config.yaml",
    "curation_corpus_summarization_preprocessing.yaml", "dpo_preprocessing.yaml",
    "esm2_preprocessing_pre_training.yaml", "fim_aug_preprocessing.yaml", "finetuning_context_split.yaml",
    "finetuning_data_split.yaml", "hf_autoregressive_lm_preprocessing.yaml", "llava_phase_1_llama3.yaml",
    "llava_phase_2_preproc.yaml", "llava_single_image_token.yaml", "mllama_preproc_using_llava_phase_2.yaml",
    "multi_turn_dialogue_preprocessing.yaml", "multimodal_pretraining_conceptual_captions.yaml",
    "nlg_preprocessing.yaml", "pretraining_data_context_split.yaml", "summarization_preprocessing.yaml",
    "wikitext103_lm_preprocessing.yaml",
]


def test_every_release_config_is_matched_or_named():
    """Each of the 19 configs is either run against the vendor (a case) or deferred with its reason."""
    matched = {c[1] for c in pc.CASES}
    assert len(RELEASE_CONFIGS) == 19
    assert matched | set(pc.DEFERRED) == set(RELEASE_CONFIGS)
    assert not matched & set(pc.DEFERRED)


def test_output_trains_in_cs_run(tmp_path: Path) -> None:
    """The GPT data processor reads a --config output folder as it is: its batches are the written samples."""
    out = tmp_path / "out"
    preprocess_config(str(_config("hf_pretraining_txt_gz_chunks", tmp_path, out)))
    written = np.concatenate([data["data"][0] for _, data in _h5(out).values()])
    loader = build_dataloader("train", data_dir=str(out), batch_size=4, shuffle=False, drop_last_batch=False)
    batches = list(loader)
    assert sum(len(b["input_ids"]) for b in batches) == len(written)
    got = {tuple(row) for b in batches for row in b["input_ids"].tolist()}
    assert got == {tuple(row) for row in written[:, 0].tolist()}
    assert {tuple(r) for b in batches for r in b["labels"].tolist()} == {tuple(r) for r in written[:, 2].tolist()}


def test_vsl_output_trains_in_cs_run(tmp_path: Path) -> None:
    """use_vsl output read by the GPT HDF5 processor's use_vsl: by hand, each packed document's positions count up
    from 0 and its attention spans down to 0, restarting after its eos (every document here ends in eos; the last
    one's eos is no input, it is the sample's last label)."""
    out = tmp_path / "out"
    preprocess_config(str(_config("hf_pretraining_vsl", tmp_path, out)))
    eos = json.loads((out / "data_params.json").read_text())["processing"]["eos_id"]
    loader = build_dataloader("train", data_dir=str(out), batch_size=4, shuffle=False, drop_last_batch=False,
                              use_vsl=True)
    seen = packed = 0
    for batch in loader:
        assert set(batch) == {"input_ids", "attention_mask", "labels", "attention_span", "position_ids"}
        for b in range(len(batch["input_ids"])):
            ids, labels = batch["input_ids"][b].tolist(), batch["labels"][b].tolist()
            n = int(batch["attention_mask"][b].sum())
            ends = [i + 1 for i in range(n - 1) if ids[i] == eos] + [n]
            pos, span, start = [], [], 0
            for end in ends:
                pos += range(end - start)
                span += range(end - start - 1, -1, -1)
                start = end
            pad = len(ids) - n
            assert batch["position_ids"][b].tolist() == pos + [0] * pad
            assert batch["attention_span"][b].tolist() == span + [0] * pad
            assert labels[: n - 1] == ids[1:n] and labels[n - 1] == eos
            seen, packed = seen + 1, packed + len(ends)
    post = json.loads((out / "data_params.json").read_text())["post-process"]
    assert (seen, packed) == (post["n_examples"], post["num_sequences_before_packing"])
    assert packed > seen  # documents were packed together


def test_vsl_chunk_with_more_samples_than_documents(tmp_path: Path) -> None:
    """Documents longer than max_seq_length pack into more samples than the chunk had documents, where the vendor's
    tool stops on an IndexError (checked with the oracle: no sample written); cs-run writes them, and token_limit
    cuts that list at the sample that reached it (16 tokens counted per sample: 40 is reached by the third)."""
    outs = {}
    for name, limit in (("all", ""), ("limited", "\n  token_limit: 40")):
        out = outs[name] = tmp_path / name
        config = _config("hf_pretraining_packed", tmp_path, out)
        config.write_text(config.read_text().replace("  pack_sequences: true", "  use_vsl: true")
                          .replace("  seed: 0", "  seed: 0" + limit))
        preprocess_config(str(config))
    every, limited = ([d["data"][0] for _, d in _h5(outs[n]).values()][0] for n in ("all", "limited"))
    post = json.loads((outs["all"] / "data_params.json").read_text())["post-process"]
    assert len(every) == post["n_examples"] > post["successful_files"]
    np.testing.assert_array_equal(limited, every[:3])
    assert json.loads((outs["limited"] / "data_params.json").read_text())["post-process"]["num_tokens"] == 48


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("raw,want", [
    ("1 @,@ 200 m , 3 @.@ 5 km , wafer @-@ scale", "1,200 m, 3.5 km, wafer-scale"),
    ("( about it ) [ cores ] { many } \" quiet \"", "(about it) [cores] {many} \"quiet\""),
    (" = = = Early life = = = \n The fox 's den", " === Early life ===\nThe fox's den"),
    ("held N bones at 20 \u00b0 C ; twice . ", "held 1 bones at 20\u00b0C; twice. "),
])
def test_wikitext_detokenize_rules(raw: str, want: str) -> None:
    """Hand-worked WikiText-103 strings (the recorded wikitext103 case checks the vendor's order on the rest)."""
    from cs_run.data.preprocessing.vendor_config._pretraining import wikitext_detokenize

    assert wikitext_detokenize(raw) == want


@pytest.mark.parametrize("as_dict", [False, True], ids=["dataset", "dataset-dict"])
def test_huggingface_saved_dataset(as_dict: bool, tmp_path: Path) -> None:
    """type huggingface reads a save_to_disk folder. The vendor's own tool cannot (load_dataset refuses a
    save_to_disk Dataset and misreads a DatasetDict's json files as rows), so the reference is its route for a
    Hugging Face dataset: written as parquet and read as a local input, i.e. the recorded parquet case."""
    datasets = pytest.importorskip("datasets")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pq.read_table(GOLDEN / "inputs" / "parquet" / "docs.parquet")
    saved = tmp_path / "saved"
    ds = datasets.Dataset(table)
    (datasets.DatasetDict({"train": ds, "validation": ds.select([0])}) if as_dict else ds).save_to_disk(str(saved))
    out = tmp_path / "out"
    config = _config("hf_pretraining_parquet", tmp_path, out)
    text = config.read_text()
    assert "type: local" in text
    config.write_text(text.replace(str(GOLDEN / "inputs" / "parquet"), str(saved))
                      .replace("type: local", "type: huggingface\n    split: train"))
    preprocess_config(str(config))
    want, got = _h5(GOLDEN / "hf_pretraining_parquet"), _h5(out)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name][1]["data"][0], want[name][1]["data"][0])
        assert got[name][0] == want[name][0]
    stats = [json.loads((f / "data_params.json").read_text())["post-process"] for f in (out, GOLDEN / "hf_pretraining_parquet")]
    assert stats[0] == stats[1]


def test_split_rerun_writes_nothing(tmp_path: Path) -> None:
    """A split run into an output folder whose split subfolders hold a run is refused before any record is dealt."""
    out = tmp_path / "out"
    config = _config("pretraining_data_context_split", tmp_path, out)
    preprocess_config(str(config))
    before = {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    config.write_text(config.read_text().replace(str(tmp_path / "splits"), str(tmp_path / "splits2")))
    with pytest.raises(ParamsError, match=r"setup\.output_dir .*out/train/msl_16 already holds data_params\.json"):
        preprocess_config(str(config))
    assert not (tmp_path / "splits2").exists()
    assert {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_nlg_output_trains_gpt2(tmp_path: Path) -> None:
    """Mode nlg's output is GptHDF5DataProcessor's (the vendor's NLGTokenGenerator says so): a tiny gpt2 trains
    on it as written, and step 1's loss is the cross entropy of the written labels under the written loss mask
    (row attention_mask: the completion's labels only), by hand from checkpoint_0's weights."""
    out = tmp_path / "nlg"
    preprocess_config(str(_config("nlg", tmp_path, out)))
    sizes = dict(vocab_size=400, hidden_size=16, num_hidden_layers=1, num_heads=2, filter_size=32,
                 max_position_embeddings=16, dropout_rate=0.0)
    data = {"data_processor": "GptHDF5DataProcessor", "data_dir": str(out), "batch_size": 5, "shuffle": False}
    params = {"train_input": data, "model": {"name": "gpt2", **sizes},
              "optimizer": {"optimizer_type": "AdamW", "learning_rate": 1e-2},
              "runconfig": {"max_steps": 3, "log_steps": 1, "checkpoint_steps": 3, "save_initial_checkpoint": True,
                            "seed": 1, "model_dir": str(tmp_path / "md"), "disable_progress_bar": True}}
    (tmp_path / "gpt2.yaml").write_text(yaml.safe_dump(params))
    PyTorchBaseRunner.create(load_params(str(tmp_path / "gpt2.yaml")), device="CPU").run("train")
    losses = [v for _, v in read_scalars(tmp_path / "md" / "train")["loss"]]
    model = lm.build_model(**sizes).eval()
    model.load_state_dict(load(str(tmp_path / "md" / "checkpoint_0.mdl"))["model"])
    rows = torch.from_numpy(np.concatenate([d["data"][0] for _, d in _h5(out).values()])).long()
    ids, mask, labels = rows[:, 0], rows[:, 1].double(), rows[:, 2]
    with torch.no_grad():
        ce = torch.nn.functional.cross_entropy(model.model(ids).double().transpose(1, 2), labels, reduction="none")
    expected = float((ce * mask).sum() / mask.sum())
    assert len(losses) == 3 and abs(losses[0] - expected) < 1e-5, (losses, expected)
    assert losses[-1] < losses[0]


def test_nlg_as_shipped_needs_no_ftfy(tmp_path: Path) -> None:
    """The shipped nlg config sets use_ftfy: true, which nlg's token ids never use (nor the vendor's generator):
    it runs without the ftfy package, to the vendor's arrays (it was refused for the missing package before)."""
    if _has("ftfy"):
        pytest.skip("ftfy is installed here: use_ftfy true is no question")
    out = tmp_path / "out"
    config = _config("nlg", tmp_path, out)
    config.write_text(config.read_text().replace("use_ftfy: false", "use_ftfy: true"))
    preprocess_config(str(config))
    want, got = _h5(GOLDEN / "nlg"), _h5(out)
    assert sorted(got) == sorted(want)
    for name, (_, data) in want.items():
        np.testing.assert_array_equal(got[name][1]["data"][0], data["data"][0])


@pytest.mark.parametrize("text", ["MKTAYIAK", "MKV jjz WQ", "  M K<mask>TA<cls>  x", "abcLdefA", "<null_1>L.-",
                                  "<unkL", "X B U Z O", "mk", "<pad><eos>MM", ""])
def test_esm_tokenizer_folder_splits_as_esm_tokenizer(text: str) -> None:
    """A saved EsmTokenizer folder (vocab.txt, no tokenizer.json) gives transformers' EsmTokenizer ids: vocabulary
    tokens cut out longest first, other runs split on whitespace, one <unk> per unknown piece, <cls> ... <eos>;
    cut to a length with the specials kept."""
    transformers = pytest.importorskip("transformers")
    from cs_run.data.preprocessing.vendor_config._tokenizer import esm_backend

    folder = GOLDEN / "tokenizer_esm"
    esm = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert type(esm).__name__ == "EsmTokenizer"
    ours = esm_backend(str(folder / "vocab.txt"))
    assert ours.encode(text).ids == esm(text)["input_ids"]
    ours.enable_truncation(max_length=6)
    assert ours.encode(text).ids == esm(text, max_length=6, truncation=True)["input_ids"]
