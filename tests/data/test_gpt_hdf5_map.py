"""GptHDF5MapDataProcessor on h5py-written shards in the Model Zoo's map layouts (``data`` of shape
``[n_tokens]``, the corpus, or ``[n, 3, msl]``, samples), with data_dir lists, mixture, data_subset,
num_samples and the add_sink_tokens transform; expected samples are cut from the written arrays by hand."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from cs_run.data.processors import gpt_hdf5 as data
from cs_run.data.readers.hdf5_map import DataSubset

MAP = "GptHDF5MapDataProcessor"


def _write(folder, name, array):
    folder.mkdir(parents=True, exist_ok=True)
    with h5py.File(folder / name, "w") as f:
        f.create_dataset("data", data=array)


def _rows(loader):
    return [{k: v[i].numpy() for k, v in batch.items()} for batch in loader for i in range(len(batch["input_ids"]))]


def test_corpus_layout_cuts_sequences_across_files(tmp_path):
    tokens = np.arange(100, 141, dtype=np.uint16)  # 41 tokens over two files (sorted by name: a, b)
    _write(tmp_path, "b.h5", tokens[25:])
    _write(tmp_path, "a.h5", tokens[:25])
    loader = data.build_dataloader("eval", data_dir=str(tmp_path), data_processor=MAP, max_sequence_length=8,
                                   batch_size=2, shuffle=False)
    rows = _rows(loader)
    assert len(rows) == 4  # (41 - 1) // 8 samples: each reads one extra token for its labels
    for i, row in enumerate(rows):
        window = tokens[8 * i: 8 * i + 9].astype(np.int32)  # sample 2 spans the two files
        np.testing.assert_array_equal(row["input_ids"], window[:-1])
        np.testing.assert_array_equal(row["labels"], window[1:])
        np.testing.assert_array_equal(row["attention_mask"], np.ones(8, dtype=np.int32))


def test_sample_layout_over_a_list_of_folders(tmp_path):
    rng = np.random.default_rng(0)
    first, second = rng.integers(0, 50, (3, 3, 6)), rng.integers(0, 50, (2, 3, 6))
    _write(tmp_path / "one", "0.h5", first)
    _write(tmp_path / "two", "0.h5", second)
    loader = data.build_dataloader("eval", data_dir=[str(tmp_path / "one"), str(tmp_path / "two")],
                                   data_processor=MAP, batch_size=1, shuffle=False)
    rows = _rows(loader)
    for row, sample in zip(rows, [*first, *second], strict=True):
        for k, name in enumerate(("input_ids", "attention_mask", "labels")):
            np.testing.assert_array_equal(row[name], sample[k])


def test_data_subset_keeps_the_named_fractions():
    subset = DataSubset(10, "0.0-0.2,0.5-0.7")  # the Model Zoo's segmenter: samples 0, 1, 5, 6
    assert subset.length == 4 and [subset(i) for i in range(4)] == [0, 1, 5, 6]


def test_mixture_weights_and_num_samples(tmp_path):
    _write(tmp_path / "a", "0.h5", np.zeros((4, 3, 2), dtype=np.int32))
    _write(tmp_path / "b", "0.h5", np.ones((2, 3, 2), dtype=np.int32))
    loader = data.build_dataloader("eval", data_processor=MAP, batch_size=1, shuffle=False, mixture=[
        {"data_dir": str(tmp_path / "a"), "weight": 3}, {"data_dir": str(tmp_path / "b"), "weight": 1}])
    # by hand: weights 0.75 / 0.25; epoch = max(4 / 0.75, 2 / 0.25) = 8 -> 6 samples of a, 2 of b
    values = [int(row["input_ids"][0]) for row in _rows(loader)]
    assert sorted(values) == [0] * 6 + [1] * 2
    capped = data.build_dataloader("eval", data_dir=str(tmp_path / "a"), data_processor=MAP, batch_size=1,
                                   shuffle=False, num_samples=10)
    assert len(capped) == 10  # the epoch extended to num_samples by cycling the 4 samples


def test_sink_tokens_transform(tmp_path):
    tokens = np.arange(1, 20, dtype=np.int32)
    _write(tmp_path, "0.h5", tokens)
    loader = data.build_dataloader("eval", data_dir=str(tmp_path), data_processor=MAP, max_sequence_length=6,
                                   batch_size=2, shuffle=False, data_transforms=[
                                       {"name": "add_sink_tokens", "sink_token_id": 99, "num_sink_tokens": 2}])
    batch = next(iter(loader))
    # the Model Zoo's rule: sinks prepended to input_ids and labels, zeros to the loss mask
    assert batch["input_ids"].tolist() == [[99, 99, 1, 2, 3, 4, 5, 6], [99, 99, 7, 8, 9, 10, 11, 12]]
    assert batch["labels"].tolist() == [[99, 99, 2, 3, 4, 5, 6, 7], [99, 99, 8, 9, 10, 11, 12, 13]]
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1, 1, 1]] * 2
    assert batch["input_ids"].dtype == torch.int32


@pytest.mark.parametrize("kwargs,regex", [
    ({"max_sequence_length": None}, r"^max_sequence_length: required for the corpus layout"),
    ({"data_subset": "0.5-0.2"}, r"^data_subset: '0.5-0.2': every range must lie in \[0, 1\]"),
    ({"data_subset": "half"}, r"^data_subset: 'half' is not comma-separated ranges"),
    ({"mixture": [{"data_dir": "x"}], "data_dir": None}, r"^mixture\[0\]: expected a mapping with data_dir, weight"),
    ({"mixture": [{"data_dir": "x", "weight": 1}]}, r"^data_dir: give exactly one of data_dir and mixture"),
    ({"data_transforms": [{"name": "add_pose_shift"}]}, r"^data_transforms\[0\].name: 'add_pose_shift' is not supported"),
    ({"data_transforms": [{"name": "add_sink_tokens", "num_sink_tokens": 0}]},
     r"^data_transforms\[0\].num_sink_tokens: expected an integer >= 1, got 0"),
    ({"use_vsl": True}, r"^use_vsl: the shards are the corpus layout"),
    ({"num_samples": 0}, r"^num_samples: expected a positive integer"),
    ({"data_processor": "GptHDF5DataProcessor", "data_subset": "0.0-0.5"},
     r"^data_subset: a key of GptHDF5MapDataProcessor, not of GptHDF5DataProcessor"),
])
def test_bad_inputs_name_their_key(tmp_path, kwargs, regex):
    _write(tmp_path, "0.h5", np.arange(50, dtype=np.int32))
    given = {"data_dir": str(tmp_path), "data_processor": MAP, "max_sequence_length": 4, "batch_size": 1, **kwargs}
    with pytest.raises(ValueError, match=regex):
        data.build_dataloader("train", **given)
