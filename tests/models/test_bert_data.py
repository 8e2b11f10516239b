"""bert's data processors read the Model Zoo's layouts: BertCSVDynamicMaskDataProcessor the CSV folders of
create_csv.py (meta.dat + tokens / segment_ids / is_random_next), BertHDF5DataProcessor the HDF5 shards of the
bert_pretraining preprocessing (data [n, 2, msl], labels [n, 3, max_pred] with mlm_with_gather). The
reference is the rows as written, read back by hand; bad files are one DataError naming file and line."""

from __future__ import annotations

import csv
import json

import h5py
import numpy as np
import pytest
import torch

from cs_run.data.processors.bert import build_dataloader
from cs_run.errors import DataError

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = SPECIALS + [f"w{i}" for i in range(40)]
MSL, PRED = 32, 5


def _write_csv(folder, rows: list[dict], fields=("tokens", "segment_ids", "is_random_next"), meta=None) -> None:
    """create_csv.py's layout (Release 2.10 lines 224-273, 320-326): a DictWriter CSV and meta.dat."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "part_0.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields), quoting=csv.QUOTE_MINIMAL)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row[k] for k in fields})
    (folder / "meta.dat").write_text(meta if meta is not None else f"part_0.csv {len(rows)}\n")
    (folder.parent / "vocab.txt").write_text("\n".join(WORDS) + "\n")


def _rows(n: int = 6) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        a, b = 5 + i, 8 + i
        tokens = ["[CLS]"] + [WORDS[5 + j] for j in rng.integers(0, 40, a)] + ["[SEP]"] + \
            [WORDS[5 + j] for j in rng.integers(0, 40, b)] + ["[SEP]"]
        rows.append({"tokens": str(tokens), "segment_ids": str([0] * (a + 2) + [1] * (b + 1)),
                     "is_random_next": i % 2, "list": tokens})
    return rows


def _csv_loader(tmp_path, **keys):
    return build_dataloader("train", data_processor="BertCSVDynamicMaskDataProcessor", data_dir=str(tmp_path / "d"),
                            vocab_file=str(tmp_path / "vocab.txt"), max_sequence_length=MSL,
                            max_predictions_per_seq=PRED, **{"batch_size": 3, "shuffle": False, "shuffle_seed": 1,
                                                              **keys})


def test_csv_batches_are_the_rows_with_vendor_masking(tmp_path):
    rows = _rows()
    _write_csv(tmp_path / "d", rows)
    batches = list(_csv_loader(tmp_path))
    assert len(batches) == 2 == len(_csv_loader(tmp_path))
    for b, batch in enumerate(batches):
        assert batch["input_ids"].shape == (3, MSL) and batch["labels"].shape == (3, PRED)
        for r in range(3):
            row = rows[3 * b + r]
            ids = [WORDS.index(t) for t in row["list"]]
            n = len(ids)
            got = batch["input_ids"][r]
            assert batch["attention_mask"][r].tolist() == [1] * n + [0] * (MSL - n)
            assert got[n:].eq(0).all()
            k = int(batch["masked_lm_mask"][r].sum())
            assert k == min(PRED, max(1, round(n * 0.15)))  # create_masked_lm_predictions' count
            positions = batch["masked_lm_positions"][r][:k].long()
            assert batch["labels"][r][:k].tolist() == [ids[p] for p in positions]  # the original tokens
            assert all(row["list"][p] not in SPECIALS for p in positions)  # specials are never masked
            unmasked = [p for p in range(n) if p not in positions.tolist()]
            assert got[unmasked].tolist() == [ids[p] for p in unmasked]
            assert batch["token_type_ids"][r].tolist() == json.loads(row["segment_ids"]) + [0] * (MSL - n)
            assert batch["next_sentence_label"][r].tolist() == [row["is_random_next"]]
    again = list(_csv_loader(tmp_path))  # seeded: the same masks each pass of a fresh loader
    assert all(torch.equal(x[k], y[k]) for x, y in zip(batches, again) for k in x)


def test_csv_without_nsp_reads_tokens_only_and_scales_mlm_loss(tmp_path):
    rows = _rows()
    _write_csv(tmp_path / "d", rows, fields=("tokens",))
    batch = next(iter(_csv_loader(tmp_path, disable_nsp=True, dynamic_mlm_scale=True, do_lower=True)))
    assert "token_type_ids" not in batch and "next_sentence_label" not in batch
    assert torch.allclose(batch["mlm_loss_scale"], 3 / batch["masked_lm_mask"].sum().float().expand(3, 1))


def test_hdf5_batches_are_the_shards_samples(tmp_path):
    """MLMHDF5Dataset's sample layout with mlm_with_gather: data [n, 2, msl], labels [n, 3, max_pred]."""
    rng = np.random.default_rng(1)
    data = rng.integers(0, 40, (5, 2, MSL)).astype(np.int32)
    labels = rng.integers(0, 40, (5, 3, PRED)).astype(np.int32)
    folder = tmp_path / "h5"
    folder.mkdir()
    with h5py.File(folder / "data-0.h5", "w") as f:
        f.create_dataset("data", data=data)
        f.create_dataset("labels", data=labels)
    (folder / "data_params.json").write_text(json.dumps({"dataset": {"training_objective": "mlm",
                                                                     "mlm_with_gather": True}}))
    loader = build_dataloader("eval", data_processor="BertHDF5DataProcessor", data_dir=str(folder), batch_size=2,
                              shuffle=False)
    batches = list(loader)
    assert len(batches) == 2
    for b, batch in enumerate(batches):
        rows = slice(2 * b, 2 * b + 2)
        assert batch["input_ids"].tolist() == data[rows, 0].tolist()
        assert batch["attention_mask"].tolist() == data[rows, 1].tolist()
        assert batch["labels"].tolist() == labels[rows, 0].tolist()
        assert batch["masked_lm_positions"].tolist() == labels[rows, 1].tolist()
        assert batch["masked_lm_mask"].tolist() == labels[rows, 2].tolist()


def _damage_tokens(rows):
    rows[2]["tokens"] = "[CLS] w1 [SEP]"
    return rows


def _damage_segments(rows):
    rows[1]["segment_ids"] = "zero"
    return rows


BAD = [  # (damage to the rows, meta.dat text or None, what the error names)
    pytest.param(_damage_tokens, None, r"part_0.csv:4: column 'tokens'", id="tokens-not-a-list"),
    pytest.param(_damage_segments, None, r"part_0.csv:3: NSP needs columns 'segment_ids'", id="bad-segment-ids"),
    pytest.param(None, "part_0.csv six\n", r"meta.dat:1: expected '<csv file> <number of rows>'", id="bad-meta-line"),
    pytest.param(None, "gone.csv 6\n", r"gone.csv: cannot read", id="meta-names-a-missing-file"),
    pytest.param(None, "part_0.csv 2\n", r"2 rows in meta.dat, fewer than one batch of 3", id="fewer-than-a-batch"),
]


@pytest.mark.parametrize("damage, meta, message", BAD)
def test_bad_csv_data_is_one_data_error_naming_file_and_line(tmp_path, damage, meta, message):
    rows = _rows()
    _write_csv(tmp_path / "d", damage(rows) if damage else rows, meta=meta)
    with pytest.raises(DataError, match=message):
        list(_csv_loader(tmp_path))


def test_missing_meta_and_vocab_are_data_errors(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(DataError, match=r"meta.dat: not found"):
        _csv_loader(tmp_path)
    _write_csv(tmp_path / "d", _rows())
    (tmp_path / "vocab.txt").unlink()
    with pytest.raises(DataError, match=r"vocab_file: .*vocab.txt not found"):
        _csv_loader(tmp_path)
