"""GptHDF5DataProcessor on shards written the Model Zoo's way; `cs-run data preprocess` shards load too."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cs_run.data.preprocessing.text_to_hdf5 import pack_samples
from cs_run.data.processors import gpt_hdf5 as data
from cs_run.frontends.cli import cli
from tests.examples.gpt2_helpers import random_samples, vendor_features, write_vendor_shards


def all_rows(loader):
    return [{k: v[i].numpy() for k, v in b.items()} for b in loader for i in range(len(b["input_ids"]))]


def test_vendor_shards_load_sample_for_sample(tmp_path):
    samples = random_samples(23, 8, 64)
    write_vendor_shards(tmp_path, samples, per_file=10)  # 10 + 10 + 3
    loader = data.build_dataloader("eval", data_dir=str(tmp_path), batch_size=4, shuffle=False,
                                   drop_last_batch=False)
    rows = all_rows(loader)
    assert len(rows) == 23 and len(loader) == 6
    first = next(iter(loader))
    assert {k: (v.dtype, tuple(v.shape)) for k, v in first.items()} == {
        k: (torch.int32, (4, 8)) for k in ("input_ids", "attention_mask", "labels")}
    for row, sample in zip(rows, samples):
        np.testing.assert_array_equal(row["input_ids"], sample[0])
        np.testing.assert_array_equal(row["attention_mask"], sample[1])
        np.testing.assert_array_equal(row["labels"], sample[2])


def test_n_examples_attribute_limits_rows_and_feature_order_comes_from_data_params(tmp_path):
    sample = vendor_features(list(range(9)), 8)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.attrs["n_examples"] = 2
        f.create_dataset("data", data=np.stack([sample[[2, 0, 1]]] * 3), dtype="i4")
    (tmp_path / "data_params.json").write_text(json.dumps({"features": ["labels", "input_ids", "attention_mask"]}))
    rows = all_rows(data.build_dataloader("eval", data_dir=str(tmp_path), batch_size=1, shuffle=False))
    assert len(rows) == 2
    np.testing.assert_array_equal(rows[0]["input_ids"], sample[0])
    np.testing.assert_array_equal(rows[0]["labels"], sample[2])


def test_shuffle_is_a_seeded_permutation_independent_of_workers(tmp_path):
    samples = random_samples(40, 8, 64)
    write_vendor_shards(tmp_path, samples, per_file=7)

    def order(**kw):
        loader = data.build_dataloader("train", data_dir=str(tmp_path), batch_size=5, shuffle=True, shuffle_seed=3,
                                       **kw)
        return [tuple(r["input_ids"]) for r in all_rows(loader)]

    plain = order()
    assert sorted(plain) == sorted(tuple(s[0]) for s in samples) and plain != [tuple(s[0]) for s in samples]
    assert order() == plain
    assert order(num_workers=2, prefetch_factor=2, persistent_workers=True) == plain


@pytest.mark.parametrize("damage,message", [
    ("no_files", "no \\*.h5 files"),
    ("no_data", "has no dataset 'data'"),
    ("two_rows", "expected integers of shape"),
    ("floats", "expected integers of shape"),
    ("n_examples", "n_examples=9"),
    ("not_hdf5", "not a readable HDF5 file"),
    ("msl_mismatch", "max_sequence_length 4"),
])
def test_bad_shards_are_errors_naming_data_dir(tmp_path, damage, message):
    good = np.stack(random_samples(3, 8, 64))
    write_vendor_shards(tmp_path, list(good), per_file=3)
    bad = tmp_path / "z.h5"
    if damage == "no_files":
        (tmp_path / "examples_0.h5").unlink()
    elif damage == "not_hdf5":
        bad.write_bytes(b"not hdf5")
    else:
        with h5py.File(bad, "w") as f:
            if damage == "no_data":
                f.create_dataset("other", data=good)
            elif damage == "two_rows":
                f.create_dataset("data", data=good[:, :2])
            elif damage == "floats":
                f.create_dataset("data", data=good.astype(np.float32))
            elif damage == "n_examples":
                f.attrs["n_examples"] = 9
                f.create_dataset("data", data=good)
            else:
                f.create_dataset("data", data=good[:, :, :4])
    with pytest.raises(ValueError, match=f"data_dir: .*{message}"):
        data.build_dataloader("train", data_dir=str(tmp_path), batch_size=2)


def test_other_bad_inputs(tmp_path):
    write_vendor_shards(tmp_path, random_samples(3, 8, 64), per_file=3)
    with pytest.raises(ValueError, match="data_processor: 'GptTextDataProcessor'"):
        data.build_dataloader("train", data_dir=str(tmp_path), data_processor="GptTextDataProcessor")
    with pytest.raises(ValueError, match="batch_size: 4 per streamer but the train shards hold 3"):
        data.build_dataloader("train", data_dir=str(tmp_path), batch_size=4)
    with pytest.raises(ValueError, match="max_sequence_length: 16"):
        data.build_dataloader("train", data_dir=str(tmp_path), batch_size=1, max_sequence_length=16)
    with pytest.raises(ValueError, match="is not a folder"):
        data.build_dataloader("train", data_dir=str(tmp_path / "missing"))


def test_packing_follows_the_model_zoo_windows():
    # msl 4: windows of 5 tokens stepping by 4; a document's tail carries into the next; eos (9) ends each.
    docs = [[1, 2, 3, 4, 5, 6], [7, 8]]
    out = list(pack_samples(docs, 4, eos_id=9, pad_id=0))
    stream = [1, 2, 3, 4, 5, 6, 9, 7, 8, 9]
    expected = [vendor_features(stream[0:5], 4), vendor_features(stream[4:9], 4), vendor_features(stream[8:], 4)]
    assert len(out) == 3
    for got, want in zip(out, expected):
        np.testing.assert_array_equal(got, want)
    assert out[2][1].tolist() == [1, 0, 0, 0]  # the padded tail is masked


def test_preprocess_cli_writes_shards_that_load(tmp_path):
    pytest.importorskip("tokenizers")
    corpus = tmp_path / "text"
    corpus.mkdir()
    words = "the quick brown fox jumps over the lazy dog while the cat sleeps".split()
    rng = np.random.default_rng(0)
    for i in range(12):
        (corpus / f"doc{i}.txt").write_text(" ".join(rng.choice(words, 300)))
    out = tmp_path / "shards"
    args = ["data", "preprocess", str(corpus), "-o", str(out), "--max_seq_length", "16", "--vocab_size", "300",
            "--eval_fraction", "0.25", "--files_per_record", "50"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "train" / "data_params.json").read_text())
    assert meta["n_files"] == len(list((out / "train").glob("*.h5"))) > 1
    loader = data.build_dataloader("train", data_dir=str(out / "train"), batch_size=8, shuffle=False,
                                   drop_last_batch=False)
    rows = all_rows(loader)
    assert len(rows) == meta["n_examples"]
    for r in rows:  # next-token labels; mask covers the real tokens
        n = int(r["attention_mask"].sum())
        np.testing.assert_array_equal(r["input_ids"][1:n], r["labels"][:n - 1])
        assert r["input_ids"].max() < meta["vocab_size"]
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    decoded = tok.decode(rows[0]["input_ids"].tolist())  # the first sample opens a train document
    assert any(p.read_text().startswith(decoded) for p in corpus.iterdir()) and len(decoded) > 16
    # Again into the same folder: refused, shards kept; with --tokenizer and --overwrite: rewritten.
    before = (out / "train" / "examples_0.h5").read_bytes()
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 2 and "already holds *.h5 shards" in again.output
    assert (out / "train" / "examples_0.h5").read_bytes() == before
    reuse = CliRunner().invoke(cli, args + ["--overwrite", "--tokenizer", str(out / "tokenizer.json")])
    assert reuse.exit_code == 0, reuse.output
    assert json.loads((out / "train" / "data_params.json").read_text())["n_examples"] == meta["n_examples"]


def test_preprocess_cli_bad_inputs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, message in (([str(tmp_path / "nope")], "does not exist"), ([str(empty)], "no files matching"),
                          ([], "no input documents")):
        result = CliRunner().invoke(cli, ["data", "preprocess", *args, "-o", str(tmp_path / "o")])
        assert result.exit_code == 2 and message in result.output, result.output


def test_data_dir_may_be_a_list_of_folders_as_in_the_model_zoo(tmp_path):
    a, b = random_samples(5, 8, 64), random_samples(7, 8, 64, seed=3)
    write_vendor_shards(tmp_path / "a", a, per_file=5)
    write_vendor_shards(tmp_path / "b", b, per_file=7, name="other")
    loader = data.build_dataloader("eval", data_dir=[str(tmp_path / "a"), str(tmp_path / "b")], batch_size=4,
                                   shuffle=False, drop_last_batch=False)
    assert sorted(tuple(r["input_ids"]) for r in all_rows(loader)) == sorted(tuple(s[0]) for s in a + b)


@pytest.mark.parametrize("dirs,message", [
    (["empty"], r"data_dir: no \*.h5 files in {tmp}/empty; write shards"),
    ([["a", "empty"]], r"data_dir\[1\]: no \*.h5 files in {tmp}/empty; .* or leave the folder out"),
    ([["a", "/etc"]], r"data_dir\[1\]: no \*.h5 files in /etc"),
    ([["empty", "a"]], r"data_dir\[0\]: no \*.h5 files in {tmp}/empty"),
    ([["a", "missing"]], r"data_dir\[1\]: {tmp}/missing is not a folder"),
    ([["a", "a/examples_0.h5"]], r"data_dir\[1\]: {tmp}/a/examples_0.h5 is not a folder"),
    ([[]], r"data_dir: an empty list; give the folder"),
    ([["a", "b"]], None),  # every folder holds shards
], ids=["single-empty", "list-entry-empty", "list-entry-etc", "first-entry-empty", "list-entry-missing",
        "list-entry-file", "empty-list", "two-good"])
def test_every_data_dir_folder_must_hold_shards(tmp_path, dirs, message):
    """One rule for a folder alone or in a list: it holds *.h5 shards (a list entry without any was taken)."""
    write_vendor_shards(tmp_path / "a", random_samples(4, 8, 64), per_file=4)
    write_vendor_shards(tmp_path / "b", random_samples(4, 8, 64, seed=1), per_file=4)
    (tmp_path / "empty").mkdir()
    given = dirs[0]
    data_dir = [str(tmp_path / d) for d in given] if isinstance(given, list) else str(tmp_path / given)
    if message is None:
        loader = data.build_dataloader("eval", data_dir=data_dir, batch_size=4, shuffle=False, drop_last_batch=False)
        assert len(all_rows(loader)) == 8
        return
    with pytest.raises(ValueError, match=message.replace("{tmp}", str(tmp_path))):
        data.build_dataloader("eval", data_dir=data_dir, batch_size=4)
