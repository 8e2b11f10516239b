"""``data preprocess --config`` with ``dataset.use_vsl``: the packing rules worked by hand.

tests/data/test_vendor_preprocess.py compares whole runs with the vendor's output; these cases pin the two
grouping rules (Release 2.10's VSLPretrainingTokenGenerator.append_within_max_length: longest first, greedy;
VSLFinetuningTokenGenerator's: from the last record back into the nearest earlier group) and one sample's rows
on lengths chosen so that a different order would group differently.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from cs_run.data.preprocessing.vendor_config import _vsl

TOK = SimpleNamespace(pad_id=0, eos_id=1)


def _packer(cls, msl: int):
    """A generator with only what packing reads (its tokenizer's pad and eos ids, max_seq_length)."""
    gen = cls.__new__(cls)
    gen.msl, gen.tok = msl, TOK
    return gen


def _seq(length: int, first: int) -> tuple[list[int], list[int]]:
    return list(range(first, first + length)), [1] * length


def test_pretraining_pieces_pack_longest_first_then_greedily() -> None:
    # pieces of 5, 20, 12, 20, 3 tokens (two documents): sorted 20a, 20b, 12, 5, 3 (stable);
    # 20a | 20b + 12 = 32 | 5 + 3 (20b + 12 + 5 would be 37)
    units = [[_seq(5, 100), _seq(20, 200)], [_seq(12, 300), _seq(20, 400), _seq(3, 500)]]
    samples, snapshots = _packer(_vsl.VslPretrainingSamples, 32).pack_chunk(units)
    firsts = [[int(t) for t in s[0] if t >= 100 and t % 100 == 0] for s in samples]
    assert firsts == [[200], [400, 300], [100, 500]]
    assert [s["num_sequences_before_packing"] for s in snapshots] == [1, 3, 5]
    assert [s["n_examples"] for s in snapshots] == [1, 2, 3]


def test_finetuning_records_join_the_nearest_earlier_group_that_fits() -> None:
    # records of 10, 20, 5, 15 tokens, msl 32: 15 joins 5 (20); that group of 20 joins 10 (30); 20 stays alone.
    # Filling the first group that fits instead would give 10 + 15 + 5.
    units = [[_seq(10, 100)], [_seq(20, 200)], [_seq(5, 300)], [_seq(15, 400)]]
    samples, _ = _packer(_vsl.VslFinetuningSamples, 32).pack_chunk(units)
    firsts = [[int(t) for t in s[0] if t >= 100 and t % 100 == 0] for s in samples]
    assert firsts == [[100, 300, 400], [200]]


def test_finetuning_sample_rows_by_hand() -> None:
    # two records: ids 5 6 7 (loss on 6 7) and 8 9 (loss on 9), msl 6
    units = [[([5, 6, 7], [0, 1, 1])], [([8, 9], [0, 1])]]
    (sample,), (stats,) = _packer(_vsl.VslFinetuningSamples, 6).pack_chunk(units)
    np.testing.assert_array_equal(sample, [
        [5, 6, 7, 8, 0, 0],  # input_ids: all but the last token, then pad
        [1, 1, 0, 1, 0, 0],  # attention_mask: the loss mask without its first position
        [6, 7, 8, 9, 0, 0],  # labels: all but the first token
        [2, 1, 0, 0, 0, 0],  # attention_span: 3 tokens, then the last record's 1 input token
        [0, 1, 2, 0, 0, 0],  # position_ids
    ])
    assert (stats["loss_valid_tokens"], stats["num_pad_tokens"], stats["num_sequences_before_packing"]) == (3, 2, 2)


def test_pretraining_sample_rows_by_hand() -> None:
    # two pieces (each a document's tokens closed by eos 1): 4 tokens and 3 tokens, msl 8; the mask drops its last
    units = [[([7, 8, 9, 1], [1, 1, 1, 1])], [([5, 6, 1], [1, 1, 1])]]
    (sample,), _ = _packer(_vsl.VslPretrainingSamples, 8).pack_chunk(units)
    np.testing.assert_array_equal(sample, [
        [7, 8, 9, 1, 5, 6, 0, 0],
        [1, 1, 1, 1, 1, 1, 0, 0],
        [8, 9, 1, 5, 6, 1, 0, 0],
        [3, 2, 1, 0, 1, 0, 0, 0],
        [0, 1, 2, 3, 0, 1, 0, 0],
    ])
