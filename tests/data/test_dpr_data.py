"""DPRHDF5DataProcessor (cs_run.data.processors.dpr) on the layout of the Model Zoo's convert_dpr_dataset.py
(data_0 [n, 3, length] questions, data_1 [n, 3, num_context, length] contexts, data_params.json), written by
tools/modelzoo_files.py: the batches are the files' rows with the vendor's labels, and a file that does not fit is
one error naming it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from cs_run.data.processors.dpr import build_dataloader
from cs_run.errors import DataError

TOOL = Path(__file__).resolve().parents[2] / "tools" / "modelzoo_files.py"
_spec = importlib.util.spec_from_file_location("modelzoo_files", TOOL)
mz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mz)


def test_batches_are_the_files_rows_with_the_vendors_labels(tmp_path):
    mz.write_dpr_shards(tmp_path, 10, length=8, num_context=3, samples_per_file=6)
    batches = list(build_dataloader("train", data_dir=str(tmp_path), batch_size=4, shuffle=False))
    assert len(batches) == 2  # 10 samples, drop_last
    rows = []
    for name in ("dataset-partition-1.h5", "dataset-partition-2.h5"):
        with h5py.File(tmp_path / name) as f:
            rows += list(zip(f["data_0"][:], f["data_1"][:]))
    b = batches[1]  # samples 4..7: across the two files
    for j, (q, c) in enumerate(rows[4:8]):
        assert torch.equal(b["questions_input_ids"][j], torch.from_numpy(q[0]))
        assert torch.equal(b["questions_attention_mask"][j], torch.from_numpy(q[1]))
        assert torch.equal(b["ctx_input_ids"][j], torch.from_numpy(c[0]))
        assert torch.equal(b["ctx_token_type_ids"][j], torch.from_numpy(c[2]))
    assert b["ctx_input_ids"].shape == (4, 3, 8) and b["ctx_input_ids"].dtype == torch.int32
    assert b["labels"].tolist() == [0, 3, 6, 9] and b["context_labels"].tolist() == [0, 1, 2, 3]


def _damage(tmp_path: Path, how: str) -> None:
    path = tmp_path / "dataset-partition-1.h5"
    if how == "no data_1":
        with h5py.File(path, "a") as f:
            del f["data_1"]
    elif how == "contexts of another length":
        with h5py.File(path, "a") as f:
            data = f["data_1"][:, :, :, :5]
            del f["data_1"]
            f.create_dataset("data_1", data=data)
    elif how == "not hdf5":
        path.write_bytes(b"not an hdf5 file")
    elif how == "features renamed":
        params = json.loads((tmp_path / "data_params.json").read_text())
        params["data_1_features"] = ["input_ids", "attention_mask", "token_type_ids"]
        (tmp_path / "data_params.json").write_text(json.dumps(params))
    elif how == "bad json":
        (tmp_path / "data_params.json").write_text("{")


@pytest.mark.parametrize("how, match", [
    ("no data_1", r"dataset-partition-1\.h5: expected datasets 'data_0'"),
    ("contexts of another length", r"dataset-partition-1\.h5: 'data_0' is \[6, 3, 8\] and 'data_1' \[6, 3, 2, 5\]"),
    ("not hdf5", r"dataset-partition-1\.h5: expected datasets"),
    ("features renamed", "data_params.json's features lack ctx_input_ids"),
    ("bad json", r"data_params\.json: not readable JSON"),
])
def test_a_file_that_does_not_fit_is_one_error_naming_it(tmp_path, how, match):
    mz.write_dpr_shards(tmp_path, 6, length=8, num_context=2)
    _damage(tmp_path, how)
    with pytest.raises(DataError, match=match):
        build_dataloader("train", data_dir=str(tmp_path), batch_size=2)


@pytest.mark.parametrize("keys, match", [
    ({"batch_size": 7}, "batch_size: 7 but the train data in .* holds 6 samples"),
    ({"use_vsl": True}, "use_vsl: DPR's shards have no attention_span"),
    ({"data_dir": None}, "data_dir: required"),
])
def test_bad_input_keys_are_errors_naming_the_key(tmp_path, keys, match):
    mz.write_dpr_shards(tmp_path, 6, length=8, num_context=2)
    with pytest.raises(ValueError, match=match):
        build_dataloader("train", **{"data_dir": str(tmp_path), "batch_size": 2, **keys})


def test_shuffle_seed_gives_one_order(tmp_path):
    mz.write_dpr_shards(tmp_path, 12, length=8, num_context=2)
    orders = [np.concatenate([b["questions_input_ids"][:, 1].numpy() for b in build_dataloader(
        "train", data_dir=str(tmp_path), batch_size=4, shuffle=True, shuffle_seed=s)]) for s in (1, 1, 2)]
    assert (orders[0] == orders[1]).all() and not (orders[0] == orders[2]).all()
