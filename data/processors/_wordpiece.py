"""BERT's word-piece tokenizer (the vendor's ``data_preparation/nlp/tokenizers/Tokenization.py`` FullTokenizer:
Google's basic tokenizer, then greedy longest-match-first word pieces) over a one-token-per-line vocab file.

The fine-tuning processors (SST-2, MNLI) tokenize raw text with it; transformers' slow ``BertTokenizer`` follows
the same rules and is the tests' reference.
"""

from __future__ import annotations

import unicodedata

__all__ = ["FullTokenizer"]

_MAX_CHARS_PER_WORD = 200


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
    return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:  # every non-letter ASCII
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def _basic_tokens(text: str, do_lower: bool) -> list[str]:
    """Clean (drop NUL, U+FFFD and controls; whitespace to spaces), space out CJK characters, lowercase and strip
    accents when ``do_lower``, split on whitespace and around each punctuation character."""
    cleaned = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or _is_control(ch):
            continue
        cleaned.append(" " if _is_whitespace(ch) else (f" {ch} " if _is_cjk(cp) else ch))
    out: list[str] = []
    for token in "".join(cleaned).split():
        if do_lower:
            token = "".join(c for c in unicodedata.normalize("NFD", token.lower()) if unicodedata.category(c) != "Mn")
        word: list[str] = []
        for ch in token:
            if _is_punctuation(ch):
                if word:
                    out.append("".join(word))
                    word = []
                out.append(ch)
            else:
                word.append(ch)
        if word:
            out.append("".join(word))
    return out


class FullTokenizer:
    """Text to word pieces of ``vocab`` (token -> id); a word with no split into pieces is ``unk_token``."""

    def __init__(self, vocab: dict, do_lower: bool, unk_token: str) -> None:
        self.vocab, self.do_lower, self.unk_token = vocab, do_lower, unk_token

    def tokenize(self, text: str) -> list[str]:
        pieces: list[str] = []
        for word in _basic_tokens(text, self.do_lower):
            pieces.extend(self._word_pieces(word))
        return pieces

    def _word_pieces(self, word: str) -> list[str]:
        if len(word) > _MAX_CHARS_PER_WORD:
            return [self.unk_token]
        out, start = [], 0
        while start < len(word):
            end, found = len(word), None
            while start < end:
                piece = ("##" if start else "") + word[start:end]
                if piece in self.vocab:
                    found = piece
                    break
                end -= 1
            if found is None:
                return [self.unk_token]
            out.append(found)
            start = end
        return out
