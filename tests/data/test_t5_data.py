"""T5DynamicDataProcessor on generated text folders: the sentinel rule by hand, the span counts of
random_spans_noise_mask, the raw length of the vendor's files (512 -> 568 raw tokens, 114 targets), every
sample's input and target put back together give the file's own tokens, seeded runs repeat, and a table of
bad inputs each one error naming the key or file."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cs_run.data.processors.t5 import build_dataloader, noise_span_to_unique_sentinel, random_spans_noise_mask, raw_sequence_lengths
from cs_run.errors import DataError

SPECIAL = ["<pad>", "</s>", "<s>", "<unk>"]
WORDS = [f"w{i}" for i in range(40)]


def _folder(tmp_path, lines: int = 12, words_per_line: int = 50) -> tuple[str, str, list]:
    """meta.dat, two text files of pseudo-random words (an unknown word among them), the vocabulary."""
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    docs = [" ".join(rng.choice(WORDS + ["zz"], words_per_line)) for _ in range(lines)]
    half = lines // 2
    (data / "a.txt").write_text("\n".join(docs[:half]) + "\n")
    (data / "b.txt").write_text("\n".join(docs[half:]) + "\n")
    (data / "meta.dat").write_text(f"a.txt {half}\nb.txt {lines - half}\n")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + WORDS) + "\n")
    return str(data), str(vocab), docs


def _loader(data, vocab, **kw):
    keys = dict(src_vocab_file=vocab, src_data_dir=data, batch_size=2, src_max_sequence_length=20,
                tgt_max_sequence_length=8, extra_ids=5, shuffle=True, shuffle_seed=3)
    return build_dataloader("train", **{**keys, **kw})


def test_sentinels_by_hand():
    tokens = np.arange(10, 20)
    mask = np.array([0, 0, 1, 1, 0, 0, 0, 1, 0, 0], dtype=bool)
    assert noise_span_to_unique_sentinel(tokens, mask, 100).tolist() == [10, 11, 99, 14, 15, 16, 98, 18, 19]
    assert noise_span_to_unique_sentinel(tokens, ~mask, 100).tolist() == [99, 12, 13, 98, 17, 97]


def test_noise_mask_has_the_vendors_counts():
    for length, noise, spans in ((100, 15, 5), (568, 85, 28), (7, 1, 1)):
        mask = random_spans_noise_mask(length, np.random.default_rng(length))
        starts = mask & ~np.pad(mask[:-1], [[1, 0]])
        assert (mask.sum(), starts.sum(), bool(mask[0])) == (noise, spans, False)


def test_raw_length_of_the_vendors_files():
    # t5_3B.yaml: src 512, tgt 114: 568 raw tokens, 85 noise in 28 spans -> 568 - 85 + 28 + 1 = 512, 85 + 28 + 1
    assert raw_sequence_lengths(512) == (568, 114)
    assert raw_sequence_lengths(20) == (21, 5)  # 21 - 3 + 1 + 1 = 20 (20 raw tokens make 19)


def _restore(inputs: list, targets: list, vocab: int) -> list:
    """The raw run: each sentinel (an id past the ``vocab`` pieces) of the input replaced by the target tokens
    behind the same sentinel."""
    spans, current = {}, None
    for t in targets:
        if t >= vocab:
            current = t
            spans[t] = []
        else:
            spans[current].append(t)
    out = []
    for t in inputs:
        out.extend(spans[t] if t in spans else [t])
    return out


def test_every_sample_puts_back_together_into_the_files_tokens(tmp_path):
    data, vocab, docs = _folder(tmp_path)
    ids = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    runs = set()
    for doc in docs:  # 50 words -> runs of 21 raw tokens (raw_sequence_lengths(20)): 21, 21, 8
        toks = [ids.get(w, 3) for w in doc.split()]
        runs.update(tuple(toks[i:i + 21]) for i in range(0, len(toks), 21))
    batches = list(_loader(data, vocab))
    assert len(batches) == 3 * len(docs) // 2
    vocab_size = len(SPECIAL) + len(WORDS)  # the sentinels count down from vocab_size + extra_ids - 1
    for b in batches:
        assert b["input_ids"].shape == (2, 20) and b["labels"].shape == (2, 8) and b["input_ids"].dtype == torch.int32
        for row in range(2):
            n, m = int(b["attention_mask"][row].sum()), int(b["decoder_attention_mask"][row].sum())
            inputs, labels = b["input_ids"][row, :n].tolist(), b["labels"][row, :m].tolist()
            assert inputs.count(vocab_size + 4) == 1 and labels[0] == vocab_size + 4  # one span: sentinel 48
            assert labels[-1] == 1 and b["decoder_input_ids"][row, 0] == 2  # </s> ends, <s> starts
            assert b["decoder_input_ids"][row, 1:m].tolist() == labels[:-1]
            assert b["input_ids"][row, n:].eq(0).all() and b["labels"][row, m:].eq(0).all()
            assert tuple(_restore(inputs, labels[:-1], vocab_size)) in runs
    again = list(_loader(data, vocab))
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(batches, again))
    other = list(_loader(data, vocab, shuffle_seed=4))
    assert any(not torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(batches, other))


def test_dynamic_loss_weight_is_batch_over_target_tokens(tmp_path):
    data, vocab, _ = _folder(tmp_path)
    b = next(iter(_loader(data, vocab, dynamic_loss_weight=True)))
    assert b["loss_weight"].shape == (2, 1)
    assert b["loss_weight"][0, 0].item() == pytest.approx(2 / b["decoder_attention_mask"].sum().item())


BAD = [  # (what to break, keys, the error's words)
    ("no meta.dat", "rm_meta", {}, "meta.dat: not found"),
    ("bad meta line", "bad_meta", {}, "meta.dat:1: expected"),
    ("vocab missing", None, {"src_vocab_file": "/nonexistent/vocab.txt"}, "src_vocab_file: /nonexistent"),
    ("vocab lacks a special", None, {"eos_token": "<eos>"}, "'<eos>' (eos_token)"),
    ("targets too long", None, {"tgt_max_sequence_length": 4}, "tgt_max_sequence_length: 4"),
    ("fewer lines than a batch", None, {"batch_size": 50}, "fewer than one batch of 50"),
    ("no data dir", None, {"src_data_dir": None}, "src_data_dir: required"),
    ("packing", None, {"pack_sequences": True}, "pack_sequences: True is not supported"),
    ("a file meta.dat names is missing", "rm_file", {}, "b.txt: cannot read"),
]


@pytest.mark.parametrize("what, breakage, keys, words", BAD, ids=[row[0] for row in BAD])
def test_bad_inputs_are_one_error_naming_the_key_or_file(tmp_path, what, breakage, keys, words):
    data, vocab, _ = _folder(tmp_path)
    if breakage == "rm_meta":
        (tmp_path / "data" / "meta.dat").unlink()
    elif breakage == "bad_meta":
        (tmp_path / "data" / "meta.dat").write_text("a.txt six\n")
    elif breakage == "rm_file":
        (tmp_path / "data" / "b.txt").unlink()
    with pytest.raises((DataError, ValueError), match=words.replace("(", r"\(").replace(")", r"\)")):
        list(_loader(data, vocab, **keys))


def _parallel(tmp_path) -> tuple[str, str]:
    """Three aligned pairs: the second's source too long for 6 tokens, the third's target empty."""
    data = tmp_path / "pairs"
    data.mkdir()
    (data / "s.txt").write_text("w1 w2 zz\nw1 w2 w3 w4 w5 w6 w7\nw9\nw4 w5\n")
    (data / "t.txt").write_text("w3 w4\nw5\n\nw6 w7 w8\n")
    (data / "meta.dat").write_text("s.txt t.txt 4\n")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + WORDS) + "\n")
    return str(data), str(vocab)


def test_transformer_pairs_by_hand(tmp_path):
    data, vocab = _parallel(tmp_path)
    loader = build_dataloader("train", data_processor="TransformerDynamicDataProcessor", src_vocab_file=vocab,
                              src_data_dir=data, batch_size=2, src_max_sequence_length=6, tgt_max_sequence_length=5,
                              shuffle=False)
    (b,) = list(loader)  # pairs 2 (source of 7 >= 6) and 3 (empty target) are dropped; w_i is id i + 4
    assert b["input_ids"].tolist() == [[5, 6, 3, 0, 0, 0], [8, 9, 0, 0, 0, 0]]
    assert b["labels"].tolist() == [[7, 8, 1, 0, 0], [10, 11, 12, 1, 0]]
    assert b["decoder_input_ids"].tolist() == [[2, 7, 8, 0, 0], [2, 10, 11, 12, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]
    assert b["decoder_attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]


def test_transformer_meta_needs_both_files(tmp_path):
    data, vocab = _parallel(tmp_path)
    (tmp_path / "pairs" / "meta.dat").write_text("s.txt 4\n")
    with pytest.raises(DataError, match="meta.dat:1: expected '<source file> <target file> <number of lines>'"):
        build_dataloader("train", data_processor="TransformerDynamicDataProcessor", src_vocab_file=vocab,
                         src_data_dir=data, batch_size=2, src_max_sequence_length=6, tgt_max_sequence_length=5)
