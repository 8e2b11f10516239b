"""SST2DataProcessor and MNLIDataProcessor on tiny GLUE folders written in the vendor's layout
(Release 2.10 data/nlp/bert/BertClassifierDataProcessor.py: SST-2 read_tsv lines 214-223, train.tsv / dev.tsv
with ``sentence`` and ``label``; MNLI read_tsv lines 280-303, train.tsv or dev_matched.tsv + dev_mismatched.tsv
with ``sentence1``, ``sentence2``, ``gold_label``; tab-separated, no quoting). Word pieces are compared with
transformers' slow BertTokenizer on the same vocab, the rest of encode_sequence (lines 133-191) by hand."""

from __future__ import annotations

import pytest
import torch

from cs_run.data.processors.bert_classifier import build_dataloader
from cs_run.errors import DataError

transformers = pytest.importorskip("transformers")

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "movie", "was", "great", "terrible", "a", "man",
         "is", "walk", "##ing", "dog", "runs", ",", "!", "not", "cafe", "."]
SST = "sentence\tlabel\nThe movie was GREAT!\t1\nthe movie was not terrible , \"cafe\"\t0\nA man\t1\nCafé walking\t0\n"
MNLI = ("index\tsentence1\tsentence2\tgold_label\n0\tA man is walking the dog.\tThe dog runs!\tentailment\n"
        "1\tThe movie\tA movie was great great great great\tneutral\n2\tthe dog\ta man\tcontradiction\n")


def _folder(tmp_path, files: dict):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return tmp_path


def _batches(folder, processor, split, msl=12, batch_size=2, **kw):
    return list(build_dataloader(split, data_processor=processor, data_dir=str(folder), batch_size=batch_size,
                                 vocab_file=str(folder / "vocab.txt"), do_lower=True, max_sequence_length=msl,
                                 shuffle=False, **kw))


def _reference(folder, a: str, b=None, msl=12):
    """encode_sequence by hand on transformers' word pieces: [CLS] a [SEP] (b [SEP]), longer side cut first,
    segment 1 on positions len(a) .. len(a)+len(b)-1 (the vendor's offsets, line 189-191)."""
    tok = transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)
    ta, tb = tok.tokenize(a), tok.tokenize(b) if b else []
    while b and len(ta) + len(tb) > msl - 3:
        (ta if len(ta) > len(tb) else tb).pop()
    if not b:
        ta = ta[:msl - 2]
    ids = [2] + tok.convert_tokens_to_ids(ta) + [3] + (tok.convert_tokens_to_ids(tb) + [3] if b else [])
    seg = [0] * msl
    for i in range(len(ta), len(ta) + len(tb)):
        seg[i] = 1
    return ids + [0] * (msl - len(ids)), [1] * len(ids) + [0] * (msl - len(ids)), seg


def test_sst2_rows_match_the_vendor_encoding(tmp_path):
    folder = _folder(tmp_path, {"train.tsv": SST, "dev.tsv": SST})
    batches = _batches(folder, "SST2DataProcessor", "train", msl=8)
    assert len(batches) == 2
    sentences = ["The movie was GREAT!", "the movie was not terrible , \"cafe\"", "A man", "Café walking"]
    for i, sentence in enumerate(sentences):
        ids, mask, seg = _reference(folder, sentence, msl=8)
        row = batches[i // 2]
        assert row["input_ids"][i % 2].tolist() == ids
        assert row["attention_mask"][i % 2].tolist() == mask
        assert row["token_type_ids"][i % 2].tolist() == seg
    assert torch.cat([b["labels"] for b in batches]).tolist() == [1, 0, 1, 0]
    assert batches[0]["input_ids"][0].tolist()[:6] == [2, 5, 6, 7, 8, 18]  # by hand: the movie was great !


def test_mnli_pairs_labels_and_matched_flags(tmp_path):
    folder = _folder(tmp_path, {"train.tsv": MNLI, "dev_matched.tsv": MNLI,
                                "dev_mismatched.tsv": MNLI.replace("neutral", "entailment")})
    train = _batches(folder, "MNLIDataProcessor", "train", batch_size=3)
    assert train[0]["labels"].tolist() == [0, 1, 2] and "is_matched" not in train[0]
    pairs = [("A man is walking the dog.", "The dog runs!"), ("The movie", "A movie was great great great great"),
             ("the dog", "a man")]
    for i, (a, b) in enumerate(pairs):
        ids, mask, seg = _reference(folder, a, b)
        assert train[0]["input_ids"][i].tolist() == ids
        assert train[0]["attention_mask"][i].tolist() == mask
        assert train[0]["token_type_ids"][i].tolist() == seg
    evals = _batches(folder, "MNLIDataProcessor", "eval", batch_size=3)
    assert [b["is_matched"].tolist() for b in evals] == [[1, 1, 1], [0, 0, 0]]
    assert [b["is_mismatched"].tolist() for b in evals] == [[0, 0, 0], [1, 1, 1]]
    assert evals[1]["labels"].tolist() == [0, 0, 2]


BAD = [
    ("SST2DataProcessor", {"dev.tsv": SST}, "train", "train.tsv: not found"),
    ("SST2DataProcessor", {"train.tsv": "text\tlabel\nhi\t1\n"}, "train", "train.tsv:1: no column 'sentence'"),
    ("SST2DataProcessor", {"train.tsv": "sentence\tlabel\nhi\tpositive\n"}, "train", "train.tsv:2: column 'label'"),
    ("MNLIDataProcessor", {"train.tsv": MNLI.replace("neutral", "maybe")}, "train", "train.tsv:3: column 'gold_label'"),
    ("MNLIDataProcessor", {"dev_matched.tsv": MNLI}, "eval", "dev_mismatched.tsv: not found"),
    ("MNLIDataProcessor", {"train.tsv": MNLI}, "train", "fewer than one batch of 8"),
]


@pytest.mark.parametrize("processor,files,split,message", BAD, ids=[m.split(":")[0] + str(i) for i, (*_, m)
                                                                    in enumerate(BAD)])
def test_bad_inputs_are_one_error_naming_the_file(tmp_path, processor, files, split, message):
    folder = _folder(tmp_path, files)
    with pytest.raises(DataError, match=message.replace("'", "'").replace(".", r"\.")):
        _batches(folder, processor, split, batch_size=8 if "batch" in message else 1)


def test_bad_keys_name_the_key(tmp_path):
    folder = _folder(tmp_path, {"train.tsv": SST})
    with pytest.raises(ValueError, match="^vocab_file: required"):
        build_dataloader("train", data_processor="SST2DataProcessor", data_dir=str(folder), max_sequence_length=8)
    with pytest.raises(ValueError, match="^data_processor: 'QQPDataProcessor'"):
        build_dataloader("train", data_processor="QQPDataProcessor", data_dir=str(folder))
