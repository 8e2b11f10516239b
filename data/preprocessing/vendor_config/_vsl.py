"""``dataset.use_vsl``: variable-sequence-length samples, several sequences packed into one row of msl tokens.

Each sample is 5 x max_seq_length int32: ``input_ids, attention_mask, labels, attention_span, position_ids``
(what the GPT HDF5 processor's ``use_vsl`` reads). The rules are the vendor's (Release 2.10
VSLPretrainingTokenGenerator / VSLFinetuningTokenGenerator), packing within one read chunk only:

* pretraining: every document is cut into pieces of up to ``max_seq_length + 1`` tokens (no carry between
  documents; eos closes the last piece as in plain pretraining; pieces under ``min_sequence_len`` dropped). The
  chunk's pieces, longest first (a stable sort), are grouped greedily: a piece that would take the group over
  ``max_seq_length`` tokens starts a new group. A group's tokens are joined, inputs are all but the last token,
  labels all but the first, the mask the pieces' (all ones) without its last;
* finetuning: a record is its tokens and loss mask (a record over ``max_seq_length`` or under
  ``min_sequence_len`` tokens is dropped); from the chunk's last record backwards, each record joins the nearest
  earlier group it fits in (``max_seq_length`` tokens); inputs and labels as above, the mask without its first;
* per sequence, ``attention_span`` counts down to 0 and ``position_ids`` up from 0 (the group's last sequence
  one token shorter: its last token is no input); padding is pad_id (ids, labels) and 0 (the other rows);
* counts: the documents' character and file counts, then the token counts of the packed samples and
  ``num_sequences_before_packing`` (data_params.json adds ``vsl_packing_factor``).

Where a read chunk packs into more samples than it had records (pretraining documents longer than
max_seq_length), the vendor's tool stops on an IndexError in its DataFrame.tokenize and writes nothing more;
cs-run writes those samples.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ._finetuning import FinetuningSamples
from ._pretraining import PretrainingSamples, sample_stats

__all__ = ["VSL_FEATURES", "VslFinetuningSamples", "VslPretrainingSamples"]

VSL_FEATURES = ["input_ids", "attention_mask", "labels", "attention_span", "position_ids"]
"""data_params.json's ``features`` with use_vsl (the vendor's names, in its order)."""


def _pack_rows(seqs: list[tuple[list[int], list[int]]], msl: int, pad_id: int, mask_from_first: bool) -> np.ndarray:
    """One 5-row sample of the sequences ``(ids, mask)`` joined; the mask keeps its first position (pretraining)
    or its last (finetuning), as the vendor's two generators shift it."""
    ids = [t for s, _ in seqs for t in s]
    mask = [m for _, ms in seqs for m in ms]
    span, pos = [], []
    for i, (s, _) in enumerate(seqs):
        n = len(s) - 1 if i == len(seqs) - 1 else len(s)
        span += range(n - 1, -1, -1)
        pos += range(n)
    inputs, labels = ids[:-1], ids[1:]
    mask = mask[:-1] if mask_from_first else mask[1:]
    pad = msl - len(inputs)
    return np.array([inputs + [pad_id] * pad, mask + [0] * pad, labels + [pad_id] * pad, span + [0] * pad,
                     pos + [0] * pad], dtype=np.int32)


def _packed(groups: list[list[tuple]], msl: int, pad_id: int, tok, mask_from_first: bool) -> tuple[list, list]:
    """The samples of ``groups`` and the running counts after each (the vendor's checkpoint list)."""
    samples, snapshots, stats = [], [], defaultdict(int)
    for group in groups:
        sample = _pack_rows(group, msl, pad_id, mask_from_first)
        sample_stats(sample, tok, msl, stats)
        stats["num_sequences_before_packing"] += len(group)
        samples.append(sample)
        snapshots.append(dict(stats))
    return samples, snapshots


class VslPretrainingSamples(PretrainingSamples):
    """Documents in, pieces out (never packed across documents); :meth:`pack_chunk` joins one read chunk's pieces."""

    def __init__(self, tok, **kwargs) -> None:
        super().__init__(tok, **{**kwargs, "pack_sequences": False})

    def _sample(self, piece: list[int], stats: dict):
        """A piece as it is, ``(ids, mask)`` (counted only once packed)."""
        if len(piece) < self.min_len:
            return None
        return (list(piece), [1] * len(piece))

    def pack_chunk(self, units: list[list[tuple]]) -> tuple[list[np.ndarray], list[dict]]:
        """One read chunk's pieces (per document) grouped longest first and packed."""
        flat = [piece for unit in units for piece in unit]
        flat.sort(key=lambda p: len(p[0]), reverse=True)
        groups, group, length = [], [], 0
        for piece in flat:
            if length + len(piece[0]) > self.msl:
                if group:
                    groups.append(group)
                group, length = [], 0
            group.append(piece)
            length += len(piece[0])
        if group:
            groups.append(group)
        return _packed(groups, self.msl, self.tok.pad_id, self.tok, mask_from_first=True)


class VslFinetuningSamples(FinetuningSamples):
    """Records in, ``(ids, mask)`` out; :meth:`pack_chunk` joins one read chunk's records."""

    def _sample(self, ids: list[int], mask: list[int], stats: dict) -> list:
        return [(list(ids), list(mask))]

    def pack_chunk(self, units: list[list[tuple]]) -> tuple[list[np.ndarray], list[dict]]:
        """One read chunk's records merged from the last backwards into the nearest earlier group that fits."""
        groups = [list(unit) for unit in units]
        lengths = [len(unit[0][0]) for unit in units]
        i = len(groups) - 1
        while i > 0:
            for j in range(i - 1, -1, -1):
                if lengths[i] + lengths[j] <= self.msl:
                    groups[j].extend(groups[i])
                    lengths[j] += lengths[i]
                    del groups[i], lengths[i]
                    break
            i -= 1
        return _packed(groups, self.msl, self.tok.pad_id, self.tok, mask_from_first=False)
