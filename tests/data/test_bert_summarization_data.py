"""BertSumCSVDataProcessor on tiny BERTSUM folders in the vendor's layout (Release 2.10
data_preparation/nlp/extractive_summarisation_utils.py lines 31 and 53-86: meta.dat and CSVs of
input_token_ids, labels, segment_ids, cls_ids integer lists; data/nlp/bert/BertSumCSVDataProcessor.py
create_bertsum_feature lines 348-399 and pad_input_sequence: pad or cut, masks by ``!= pad_id``), by hand."""

from __future__ import annotations

import pytest
from csv_folders import write_train_split

from cs_run.data.processors.bert_summarization import build_dataloader
from cs_run.errors import DataError

HEADER = ["input_token_ids", "labels", "segment_ids", "cls_ids"]
ROWS = [["[2, 7, 8, 3, 2, 9, 3]", "[1, 0]", "[0, 0, 0, 0, 1, 1, 1]", "[0, 4]"],
        ["[2, 7, 3, 2, 8, 3, 2, 9, 9, 3]", "[0, 1, 1]", "[0, 0, 0, 1, 1, 1, 0, 0, 0, 0]", "[0, 3, 6]"]]


def _folder(tmp_path, rows=ROWS, header=HEADER):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n")
    write_train_split(tmp_path, header, rows)
    return tmp_path


def _batch(folder, **kw):
    keys = dict(data_dir=str(folder / "train"), batch_size=2, vocab_file=str(folder / "vocab.txt"),
                max_sequence_length=8, max_cls_tokens=2, shuffle=False)
    return next(iter(build_dataloader("train", **{**keys, **kw})))


def test_features_by_hand(tmp_path):
    batch = _batch(_folder(tmp_path))
    # padded to 8 with [PAD] (0), the second row cut at 8; labels and cls ids to 2 sentences
    assert batch["input_ids"].tolist() == [[2, 7, 8, 3, 2, 9, 3, 0], [2, 7, 3, 2, 8, 3, 2, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 1, 0], [1] * 8]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[1, 0], [0, 1]]
    assert batch["cls_indices"].tolist() == [[0, 4], [0, 3]]
    assert batch["cls_weights"].tolist() == [[0.0, 1.0], [0.0, 1.0]]  # the vendor's != pad_id: position 0 weighs 0


def test_pad_id_given(tmp_path):
    batch = _batch(_folder(tmp_path), pad_id=7, max_cls_tokens=3)
    assert batch["input_ids"].tolist()[0] == [2, 7, 8, 3, 2, 9, 3, 7]
    assert batch["attention_mask"].tolist()[0] == [1, 0, 1, 1, 1, 1, 1, 0]  # token 7 is padding by the rule
    assert batch["cls_indices"].tolist() == [[0, 4, 7], [0, 3, 6]]
    assert batch["cls_weights"].tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]


BAD = [
    ({"header": ["input_token_ids", "labels", "segment_ids"]}, {}, "part.csv:1: expected the columns"),
    ({"rows": [["2 7 3", "[1]", "[0, 0, 0]", "[0]"]] * 2}, {}, "part.csv:2: column 'input_token_ids'"),
    ({"rows": [["[2, 7, 3]", "[1]", "[0, 0, 0]", "[0, x]"]] * 2}, {}, "part.csv:2: column 'cls_ids'"),
    ({"rows": [["[2, 7, 3]", "[1, 0]", "[0, 0, 0]", "[0, 12]"]] * 2}, {}, r"part.csv:2: a \[CLS\] position \(12\)"),
    ({}, {"batch_size": 3}, "fewer than one batch of 3"),
]


@pytest.mark.parametrize("folder_kw,keys,message", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_inputs_are_one_error_naming_file_and_line(tmp_path, folder_kw, keys, message):
    with pytest.raises(DataError, match=message):
        _batch(_folder(tmp_path, **folder_kw), **keys)


def test_missing_keys_are_named(tmp_path):
    folder = _folder(tmp_path)
    with pytest.raises(ValueError, match="^max_cls_tokens: required"):
        build_dataloader("train", data_dir=str(folder / "train"), vocab_file=str(folder / "vocab.txt"),
                         max_sequence_length=8)
    with pytest.raises(ValueError, match="^pad_id: must be >= 0"):
        _batch(folder, pad_id=-1)
