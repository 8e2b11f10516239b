"""BERT pretraining samples as the vendor's tool writes them (mode pretraining, ``training_objective:
bert_pretraining``).

The rules are Release 2.10's BertPretrainingTokenGenerator, written down so a change is seen. Nothing is
masked here (the vendor masks nothing at preprocessing time) and nothing is drawn at random:

* a record's text is tokenized whole with the tokenizer's special tokens (``[CLS] ... [SEP]``) and its
  token type ids, then cut into pieces of ``max_seq_length`` tokens (only the first, with
  ``dataset.truncate_to_msl``); nothing is carried to the next record (``pack_sequences`` is off, as the
  vendor forces it) and no eos is added;
* a piece shorter than ``min_sequence_len`` is dropped;
* a sample is ``[input_ids, attention_mask, token_type_ids]`` (3 x max_seq_length): ids padded with pad,
  the mask 1 over the piece, the type ids padded with the piece's last type id.
"""

from __future__ import annotations

import numpy as np

from ._pretraining import PretrainingSamples, sample_stats

__all__ = ["FEATURES", "BertSamples"]

FEATURES = ["input_ids", "attention_mask", "token_type_ids"]
"""data_params.json's ``features`` for bert_pretraining (the vendor's names, in its order)."""


class BertSamples(PretrainingSamples):
    """Records in, samples out; the text and counts as :class:`PretrainingSamples`, the cut as above."""

    def __init__(self, tok, *, truncate_to_msl: bool, **kwargs) -> None:
        super().__init__(tok, **{**kwargs, "pack_sequences": False})
        self.truncate = bool(truncate_to_msl)

    def document(self, entries: list[dict], stats: dict, where: str = "") -> list[np.ndarray]:
        """The samples of one record's hook output (from ``where``, file:line); adds its counts to ``stats``."""
        text = self._text(entries, stats)
        if text == "":
            return []
        enc = self.tok.backend.encode(text)
        ids, types = list(enc.ids), list(enc.type_ids)
        starts = [0] if self.truncate else range(0, len(ids), self.msl)
        out = []
        for start in starts:
            piece, piece_types = ids[start: start + self.msl], types[start: start + self.msl]
            if len(piece) < self.min_len:
                continue
            pad = self.msl - len(piece)
            sample = np.array([piece + [self.tok.pad_id] * pad, [1] * len(piece) + [0] * pad,
                               piece_types + piece_types[-1:] * pad], dtype=np.int32)
            sample_stats(sample, self.tok, self.msl, stats)
            out.append(sample)
        stats["processed_files"] += 1
        stats["successful_files" if out else "discarded_files"] += 1
        return out
