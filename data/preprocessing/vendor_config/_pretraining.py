"""Pretraining samples as the vendor's tool cuts them (mode pretraining, text only).

Each document is tokenized whole and cut into pieces of ``max_seq_length + 1`` tokens; a piece becomes
one sample ``[input_ids, input_mask, labels]`` (3 x max_seq_length int32): inputs are the piece
without its last token, labels without its first, the mask 1 over real tokens, then pad. The rules
below are the vendor's (Release 2.10 PretrainingTokenGenerator), written down so a change is seen:

* packing on: the short last piece of a document is carried into the next document; the carried rest
  of the last document is written at the end (the vendor's ``*_prefix.h5``);
* packing off: every document's last piece is a sample of its own, padded;
* eos: the last piece a document emits gets eos appended, or its last token replaced by eos when the
  piece is already full (so with packing, eos lands only where a document closes a full piece);
* a piece shorter than ``min_sequence_len`` tokens is dropped;
* ``short_seq_prob``: a seeded ``random.Random(seed)`` draws once per piece; a hit cuts the piece to
  ``randint(2, max_seq_length - 1)`` tokens.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Optional

import numpy as np

from cs_run.errors import ParamsError

from ._tokenizer import LoadedTokenizer

__all__ = ["FEATURES", "PretrainingSamples", "STATS_KEYS"]

FEATURES = ["input_ids", "attention_mask", "labels"]
"""data_params.json's ``features`` for this mode (the vendor's names, in its order)."""

STATS_KEYS = ["normalized_bytes_count", "normalized_chars_count", "raw_bytes_count", "raw_chars_count",
              "average_chars_per_sequence", "average_bytes_per_sequence", "discarded_files", "processed_files",
              "successful_files", "loss_valid_tokens", "num_pad_tokens", "non_pad_tokens", "num_masked_tokens",
              "num_tokens", "n_examples"]
"""data_params.json's ``post-process`` keys for this mode."""


# WikiText-103's tokenization undone, in the vendor's order (Release 2.10 utils.wikitext_detokenizer): each
# row is (pattern, replacement, is_regex). The second row matches the literal text "/' N/" (its pattern, as
# the vendor writes it, is slashes around "' [0-9]"), kept as it is so the output stays the vendor's.
_WIKITEXT = [
    ("s '", "s'", False), (r"/' [0-9]/", r"/'[0-9]/", True),
    (" @-@ ", "-", False), (" @,@ ", ",", False), (" @.@ ", ".", False),
    (" : ", ": ", False), (" ; ", "; ", False), (" . ", ". ", False), (" ! ", "! ", False), (" ? ", "? ", False),
    (" , ", ", ", False),
    (r"\(\s*([^\)]*?)\s*\)", r"(\1)", True), (r"\[\s*([^\]]*?)\s*\]", r"[\1]", True),
    (r"{\s*([^}]*?)\s*}", r"{\1}", True), (r"\"\s*([^\"]*?)\s*\"", r'"\1"', True),
    (r"'\s*([^']*?)\s*'", r"'\1'", True),
    ("= = = =", "====", False), ("= = =", "===", False), ("= =", "==", False),
    (" \u00b0 ", "\u00b0", False), (" \n", "\n", False), ("\n ", "\n", False), (" N ", " 1 ", False),
    (" 's", "'s", False),
]


def wikitext_detokenize(text: str) -> str:
    """WikiText-103's spaced-out punctuation and @-@ separators joined back, as processing.wikitext_detokenize asks."""
    import re  # noqa: PLC0415

    for pattern, repl, is_regex in _WIKITEXT:
        text = re.sub(pattern, repl, text) if is_regex else text.replace(pattern, repl)
    return text


def clean_text(text: str, use_ftfy: bool, normalizer: str, wikitext: bool = False) -> str:
    """The text as the vendor tokenizes it: ftfy's fix_text when asked (needs ftfy), then the wikitext
    detokenizer when asked."""
    if use_ftfy:
        import ftfy  # noqa: PLC0415  (optional; the config check refused use_ftfy without it)

        text = ftfy.fix_text(text, normalization=normalizer)
    return wikitext_detokenize(text) if wikitext else text


def clean_and_count(value: str, use_ftfy: bool, normalizer: str, stats: dict, wikitext: bool = False) -> str:
    """The cleaned text of one region, its raw and cleaned sizes added to ``stats`` (chars and utf-8 bytes)."""
    cleaned = clean_text(value, use_ftfy, normalizer, wikitext)
    stats["raw_chars_count"] += len(value)
    stats["raw_bytes_count"] += len(value.encode("utf-8"))
    stats["normalized_chars_count"] += len(cleaned)
    stats["normalized_bytes_count"] += len(cleaned.encode("utf-8"))
    return cleaned


def sample_stats(sample: np.ndarray, tok: LoadedTokenizer, msl: int, stats: dict) -> None:
    """Add one sample's token counts to ``stats`` (the vendor's get_data_stats: pad and non-pad inputs,
    loss-valid and masked positions)."""
    stats["num_pad_tokens"] += int((sample[0] == tok.pad_id).sum())
    stats["non_pad_tokens"] += int(np.logical_and(sample[0] != tok.eos_id, sample[0] != tok.pad_id).sum())
    stats["num_tokens"] += msl
    loss_valid = int(sample[1].sum())
    stats["loss_valid_tokens"] += loss_valid
    stats["num_masked_tokens"] += msl - loss_valid
    stats["n_examples"] += 1


def _token_end(offsets: list[tuple[int, int]], start: int, end: int) -> Optional[int]:
    """Index of the last token inside a text region ending at character ``end`` (trailing special tokens,
    whose offsets are (0, 0), fall outside it)."""
    for i in range(start, len(offsets)):
        if offsets[i][1] >= end and offsets[i][0] < end:
            return i
        if offsets[i][1] < end and (i + 1 >= len(offsets) or offsets[i + 1][0] >= end):
            return i
    return None


class PretrainingSamples:
    """Documents in, samples out; keeps the packed carry-over between documents and read chunks."""

    def __init__(self, tok: LoadedTokenizer, *, max_seq_length: int, pack_sequences: bool, short_seq_prob: float,
                 seed: int, min_sequence_len: int, use_ftfy: bool, ftfy_normalizer: str,
                 wikitext_detokenize: bool = False, inverted_mask: bool = False) -> None:
        if tok.pad_id is None:
            raise ParamsError("data preprocess --config: the tokenizer names no eos or pad token; set "
                              "processing.eos_id (and pad_id)")
        self.tok = tok
        self.msl = max_seq_length
        self.pack = pack_sequences
        self.short_seq_prob = short_seq_prob
        self.min_len = min_sequence_len
        self.use_ftfy = use_ftfy
        self.normalizer = ftfy_normalizer
        self.wikitext = wikitext_detokenize
        self.inverted_mask = inverted_mask
        self.rng = random.Random(seed)
        self.carry: Optional[list[int]] = None  # packed rest of the documents so far

    def _text(self, entries: list[dict], stats: dict) -> str:
        parts = []
        for entry in entries:
            for part in entry["content"]:
                (key, value), = part.items()
                if not value:
                    continue
                parts.append(clean_and_count(value, self.use_ftfy, self.normalizer, stats, self.wikitext))
        if len(parts) > 1:
            raise ParamsError("data preprocess --config: a read hook gave several text regions per record; cs-run's "
                              "pretraining takes one (text_read_hook)")
        return "".join(parts)

    def _pieces(self, text: str) -> list[list[int]]:
        ids, offsets = self.tok.encode(text)
        last = _token_end(offsets, 0, len(text))
        if last is None:
            raise ParamsError("data preprocess --config: the tokenizer's offsets do not cover the text; use a "
                              "tokenizer with offset mapping (a Hugging Face fast tokenizer)")
        tokens = ids[: last + 1]
        if self.pack and self.carry:
            tokens = self.carry + tokens
            self.carry = None
        width = self.msl + 1
        pieces = [tokens[i: i + width] for i in range(0, len(tokens), width)]
        if pieces and len(pieces[-1]) < width:
            rest = pieces.pop()
            if self.pack:
                self.carry = rest
            else:
                pieces.append(rest)
        return pieces

    def _close(self, piece: list[int]) -> None:
        """The vendor's eos rule for the last piece a document emits."""
        eos = self.tok.eos_id
        if not piece or eos is None or piece[-1] == eos:
            return
        if len(piece) < self.msl + 1:
            piece.append(eos)
        else:
            piece[-1] = eos

    def _sample(self, piece: list[int], stats: dict) -> Optional[np.ndarray]:
        if len(piece) < self.min_len:
            return None
        if self.rng.random() < self.short_seq_prob:
            piece = piece[: self.rng.randint(2, self.msl - 1)]
        n = len(piece) - 1
        pad = self.msl - n
        sample = np.empty((3, self.msl), dtype=np.int32)
        sample[0] = piece[:-1] + [self.tok.pad_id] * pad
        sample[1] = [1] * n + [0] * pad
        sample[2] = piece[1:] + [self.tok.pad_id] * pad
        if self.inverted_mask:  # processing.inverted_mask: 1 over padding, 0 over real tokens, counted so
            sample[1] = sample[1] == 0
        sample_stats(sample, self.tok, self.msl, stats)
        return sample

    def _emit(self, pieces: list[list[int]], stats: dict) -> list[np.ndarray]:
        if pieces:
            self._close(pieces[-1])
        out = [s for s in (self._sample(p, stats) for p in pieces) if s is not None]
        return out

    def document(self, entries: list[dict], stats: dict, where: str = "") -> list[np.ndarray]:
        """The samples one record's hook output (from ``where``, file:line) makes; adds its counts to ``stats``."""
        text = self._text(entries, stats)
        if text == "":
            return []
        pieces = self._pieces(text)
        out = self._emit(pieces, stats)
        stats["processed_files"] += 1
        if pieces:
            stats["discarded_files"] += 0 if out else 1
            stats["successful_files"] += 1 if out else 0
        else:  # all of it carried: counted as kept, as the vendor does
            stats["successful_files"] += 1 if self.carry is not None else 0
            stats["discarded_files"] += 0 if self.carry is not None else 1
        return out

    def rest(self) -> tuple[list[np.ndarray], dict]:
        """The carried tokens of the last documents as the closing samples, and their token counts."""
        stats: dict = defaultdict(int)
        if not self.carry:
            return [], stats
        pieces, self.carry = [self.carry], None
        return self._emit(pieces, stats), stats

