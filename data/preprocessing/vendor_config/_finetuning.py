"""Finetuning samples (prompt / completion) as the vendor's tool makes them: one record, one sample.

The record's text is ``prompt + sep + completion + eos`` (sep: dataset.sep_token, else the tokenizer's
sep token, else ``<|sep|>``; ``sep_token: null`` means none; eos as text), tokenized whole. The loss
mask is 1 on the completion's tokens and on the eos that closes it, 0 on the prompt and the separator
(the rules of Release 2.10's FinetuningTokenGenerator; a region's tokens are the ones whose character
offsets reach into it). A record longer than ``max_seq_length`` tokens is dropped (the vendor's
truncation, ``truncate_to_msl``, is not run here: such a record is an error naming it); one shorter
than ``min_sequence_len`` is dropped. A record missing its prompt or completion is skipped and counted
(``raw_docs_skipped``).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from cs_run.errors import DataError

from ._pretraining import _token_end, clean_text, sample_stats
from ._tokenizer import LoadedTokenizer

__all__ = ["FinetuningSamples", "STATS_KEYS"]

_DEFAULT_SEP = "<|sep|>"
STATS_KEYS = ["normalized_bytes_count", "normalized_chars_count", "raw_bytes_count", "raw_chars_count",
              "average_chars_per_sequence", "average_bytes_per_sequence", "discarded_files", "processed_files",
              "successful_files", "loss_valid_tokens", "num_pad_tokens", "non_pad_tokens", "num_masked_tokens",
              "num_tokens", "n_examples", "total_raw_docs", "raw_docs_skipped"]


def _token_start(offsets: list[tuple[int, int]], start_at: int, start: int) -> Optional[int]:
    for i in range(start_at, len(offsets)):
        if offsets[i][0] <= start < offsets[i][1] or offsets[i][0] > start:
            return i
    return None


def _extend_to_eos(text: str, regions: list[list], eos: Optional[str]) -> None:
    """Each eos that follows a region (before the next one starts) joins that region: the completion's
    closing eos is learned. ``regions`` are [start, end, loss] character ranges, changed in place."""
    if not regions or not eos:
        return
    found, at = [], regions[0][0]
    while at < len(text):
        hit = text.find(eos, at)
        if hit == -1:
            break
        at = hit + len(eos)
        found.append((hit, at))
    e = r = 0
    while e < len(found) and r < len(regions):
        eos_start, eos_end = found[e]
        start, end = regions[r][0], regions[r][1]
        if start <= eos_start < end:
            e += 1
            continue
        if r + 1 < len(regions):
            if end <= eos_start < regions[r + 1][0]:
                regions[r][1] = eos_end
                e += 1
        else:
            regions[r][1] = eos_end
            e += 1
        r += 1


class FinetuningSamples:
    """Records in, one padded sample each."""

    def __init__(self, tok: LoadedTokenizer, *, max_seq_length: int, min_sequence_len: int, use_ftfy: bool,
                 ftfy_normalizer: str, sep_token, truncate_to_msl) -> None:
        self.tok = tok
        self.msl = max_seq_length
        self.min_len = min_sequence_len
        self.use_ftfy = use_ftfy
        self.normalizer = ftfy_normalizer
        self.sep = sep_token if sep_token is not ... else (tok.sep_token or _DEFAULT_SEP)
        self.truncate = truncate_to_msl
        self.eos = tok.eos_token if tok.eos_id is not None else tok.backend.id_to_token(tok.pad_id)

    def document(self, entries: list[dict], stats: dict, where: str = "") -> list[np.ndarray]:
        """The sample one record's hook output makes (none or one); adds its counts to ``stats``."""
        stats["total_raw_docs"] += 1
        text, regions, length = "", [], 0
        for turn in entries:
            role = turn["type"]
            for part in turn["content"]:
                (_, value), = part.items()
                if not value:
                    stats["raw_docs_skipped"] += 1
                    return []
                cleaned = clean_text(value, self.use_ftfy, self.normalizer)
                stats["raw_chars_count"] += len(value)
                stats["raw_bytes_count"] += len(value.encode("utf-8"))
                stats["normalized_chars_count"] += len(cleaned)
                stats["normalized_bytes_count"] += len(cleaned.encode("utf-8"))
                regions.append([length, length + len(cleaned), 1 if role == "completion" else 0])
                length += len(cleaned)
                if role == "prompt":
                    text = cleaned + (self.sep or "")
                    length += len(self.sep or "")
                else:
                    text += cleaned + (self.eos or "")
                    length += len(self.eos or "")
        if not text:
            return []
        _extend_to_eos(text, regions, self.eos)
        ids, offsets = self.tok.encode(text)
        mask = [0] * len(ids)
        at = 0
        for start, end, loss in regions:
            first = _token_start(offsets, at, start)
            last = None if first is None else _token_end(offsets, first, end)
            if last is None:
                raise DataError(f"data preprocess --config: the tokenizer's offsets do not cover a region of {where}; "
                                "use a Hugging Face fast tokenizer")
            for i in range(first, min(last + 1, len(ids))):
                mask[i] = loss
            at = last + 1
        stats["processed_files"] += 1
        if len(ids) > self.msl and self.truncate:
            raise DataError(f"data preprocess --config: {where} is {len(ids)} tokens, over max_seq_length {self.msl}, "
                            "and dataset.truncate_to_msl (truncation) is not run by cs-run yet; remove truncate_to_msl "
                            "(such records are then dropped) or raise max_seq_length")
        if len(ids) > self.msl or len(ids) < self.min_len:
            stats["discarded_files"] += 1
            return []
        stats["successful_files"] += 1
        n = len(ids) - 1
        pad = self.msl - n
        sample = np.empty((3, self.msl), dtype=np.int32)
        sample[0] = ids[:-1] + [self.tok.pad_id] * pad
        sample[1] = mask[1:] + [0] * pad
        sample[2] = ids[1:] + [self.tok.pad_id] * pad
        sample_stats(sample, self.tok, self.msl, stats)
        return [sample]

    def rest(self) -> tuple[list[np.ndarray], dict]:
        """Finetuning carries nothing between records."""
        return [], {}
