"""BertTokenClassifierDataProcessor on tiny NER folders in the vendor's layout (Release 2.10
data/nlp/bert/BertTokenClassifierDataProcessor.py: meta.dat and comma-separated CSVs, parse_ner_row lines
394-406: ``tokens`` and ``labels`` split on spaces; create_ner_features lines 409-474: ids, attention mask,
labels padded with the [PAD] id, zero segments, loss mask = attention mask unless include_padding_in_loss;
label2id.json as ner_data_processor.py write_label_map_files, lines 229-243), each feature by hand."""

from __future__ import annotations

import json

import pytest
from csv_folders import write_train_split

from cs_run.data.processors.bert_token_classifier import build_dataloader
from cs_run.errors import DataError

VOCAB = ["[UNK]", "[PAD]", "[CLS]", "[SEP]", "aspirin", "causes", "##ed", "pain"]  # [PAD] is 1 (not 0) on purpose
LABELS = {"[PAD]": 0, "B": 1, "I": 2, "O": 3, "X": 4, "[CLS]": 5, "[SEP]": 6}
ROWS = [("[CLS] aspirin causes pain [SEP]", "[CLS] B O O [SEP]"),
        ("[CLS] Aspirin caus ##ed [SEP]", "[CLS] B O X [SEP]")]


def _folder(tmp_path, rows=ROWS, header=("tokens", "labels")):
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (tmp_path / "label2id.json").write_text(json.dumps(LABELS))
    write_train_split(tmp_path, header, rows)
    return tmp_path


def _batch(folder, **kw):
    keys = dict(data_dir=str(folder / "train"), batch_size=2, vocab_file=str(folder / "vocab.txt"),
                label_vocab_file=str(folder / "label2id.json"), max_sequence_length=7, shuffle=False)
    return next(iter(build_dataloader("train", **{**keys, **kw})))


@pytest.mark.parametrize("include_padding_in_loss", [False, True])
def test_features_by_hand(tmp_path, include_padding_in_loss):
    batch = _batch(_folder(tmp_path), do_lower=True, include_padding_in_loss=include_padding_in_loss)
    # lowered: "Aspirin" is aspirin (4); "caus" is no word piece: [UNK] (0); padding is [PAD]'s id, 1
    assert batch["input_ids"].tolist() == [[2, 4, 5, 7, 3, 1, 1], [2, 4, 0, 6, 3, 1, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 1]] * 2  # the pad id 1 is the mask's pad too
    assert batch["labels"].tolist() == [[5, 1, 3, 3, 6, 1, 1], [5, 1, 3, 4, 6, 1, 1]]
    assert batch["token_type_ids"].tolist() == [[0] * 7] * 2
    assert batch["loss_mask"].tolist() == [[1] * 7] * 2


def test_pad_ids_given_and_loss_mask(tmp_path):
    batch = _batch(_folder(tmp_path), labels_pad_id=0, input_pad_id=0, attn_mask_pad_id=0)
    assert batch["input_ids"].tolist()[0] == [2, 4, 5, 7, 3, 0, 0]
    assert batch["input_ids"].tolist()[1] == [2, 0, 0, 6, 3, 0, 0]  # not lowered: "Aspirin" is [UNK]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0, 0]] * 2
    assert batch["loss_mask"].tolist() == batch["attention_mask"].tolist()
    assert batch["labels"].tolist()[1] == [5, 1, 3, 4, 6, 0, 0]


BAD = [
    ({"rows": [("[CLS] pain [SEP]", "[CLS] O")] * 2}, {}, "part.csv:2: 3 tokens but 2 labels"),
    ({"rows": [("[CLS] pain [SEP]", "[CLS] Q [SEP]")] * 2}, {}, "part.csv:2: label 'Q' is not in"),
    ({"rows": [("[CLS] pain pain pain pain pain pain [SEP]", "[CLS] O O O O O O [SEP]")] * 2}, {},
     "part.csv:2: 8 tokens exceed max_sequence_length"),
    ({"header": ("tokens", "tags")}, {}, "part.csv:1: no column 'labels'"),
    ({}, {"label_vocab_file": "/nonexistent/label2id.json"}, "label_vocab_file: /nonexistent"),
    ({}, {"batch_size": 3}, "fewer than one batch of 3"),
]


@pytest.mark.parametrize("folder_kw,keys,message", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_inputs_are_one_error_naming_file_and_line(tmp_path, folder_kw, keys, message):
    folder = _folder(tmp_path, **folder_kw)
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace(".", r"\.")):
        _batch(folder, **keys)


def test_missing_keys_are_named(tmp_path):
    folder = _folder(tmp_path)
    with pytest.raises(ValueError, match="^label_vocab_file: required"):
        build_dataloader("train", data_dir=str(folder / "train"), vocab_file=str(folder / "vocab.txt"),
                         max_sequence_length=7)
    with pytest.raises(ValueError, match="^input_pad_id: must be >= 0"):
        _batch(folder, input_pad_id=-1)
