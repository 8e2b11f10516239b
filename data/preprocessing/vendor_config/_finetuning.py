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

import functools
from typing import Optional

import numpy as np

from cs_run.errors import DataError

from ._pretraining import _token_end, clean_and_count, sample_stats
from ._tokenizer import LoadedTokenizer

__all__ = ["FinetuningSamples", "STATS_KEYS", "render_chat"]

_DEFAULT_SEP = "<|sep|>"
STATS_KEYS = ["normalized_bytes_count", "normalized_chars_count", "raw_bytes_count", "raw_chars_count",
              "average_chars_per_sequence", "average_bytes_per_sequence", "discarded_files", "processed_files",
              "successful_files", "loss_valid_tokens", "num_pad_tokens", "non_pad_tokens", "num_masked_tokens",
              "num_tokens", "n_examples", "total_raw_docs", "raw_docs_skipped"]


RECORD_KEYS = ("total_raw_docs", "raw_docs_skipped", "discarded_files", "processed_files", "successful_files",
               "raw_chars_count", "raw_bytes_count", "normalized_chars_count", "normalized_bytes_count")
"""The counts the vendor's finetuning encode returns for every record, zeros included."""


def count_record(stats: dict) -> None:
    """One more record read; every per-record count present (a zero too), as in the vendor's running counts, whose
    copy after each sample is what processing.token_limit restores (a later skip is then not counted)."""
    for key in RECORD_KEYS:
        stats[key] += 0
    stats["total_raw_docs"] += 1


def _token_start(offsets: list[tuple[int, int]], start_at: int, start: int) -> Optional[int]:
    for i in range(start_at, len(offsets)):
        if offsets[i][0] <= start < offsets[i][1] or offsets[i][0] > start:
            return i
    return None


def render_chat(template: Optional[str], messages: list[dict], special_tokens: dict, where: str) -> str:
    """A chat template rendered as transformers renders it (sandboxed jinja2, trim_blocks, lstrip_blocks,
    the tokenizer's special tokens as variables, no generation prompt)."""
    if template is None:
        raise DataError(f"data preprocess --config: {where} is a conversation and the tokenizer has no chat "
                        "template; set dataset.chat_template or use a tokenizer folder whose tokenizer_config.json "
                        "has one")
    try:
        import jinja2.sandbox  # noqa: PLC0415  (optional: only chat data needs it)
    except ImportError:
        raise DataError(f"data preprocess --config: {where} needs its chat template rendered and jinja2 is not "
                        "installed; pip install jinja2") from None
    try:
        return _compiled(template).render(messages=messages, add_generation_prompt=False, **special_tokens)
    except jinja2.exceptions.TemplateError as e:
        raise DataError(f"data preprocess --config: the chat template fails on {where} ({e}); fix the template "
                        "or the record") from None


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    """The template compiled once per run, not per record (compiling was ~90% of a chat run's time)."""
    import jinja2.sandbox  # noqa: PLC0415  (optional: only chat data needs it)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def _occurrences(text: str, token: str, at: int) -> list[tuple[int, int]]:
    """Non-overlapping (start, end) of ``token`` in ``text`` from ``at``."""
    found = []
    while at < len(text):
        hit = text.find(token, at)
        if hit == -1:
            break
        at = hit + len(token)
        found.append((hit, at))
    return found


def _extend_to_eos(text: str, regions: list[list], eos: Optional[str], image_token: Optional[str] = None) -> None:
    """Each eos that follows a region (before the next one starts) joins that region: the completion's
    closing eos is learned. ``regions`` are [start, end, loss] character ranges, changed in place. With an
    ``image_token`` (multimodal), an eos with that token between it and the region stays out of it."""
    if not regions or not eos:
        return
    found = _occurrences(text, eos, regions[0][0])
    e = r = 0
    while e < len(found) and r < len(regions):
        eos_start, eos_end = found[e]
        start, end = regions[r][0], regions[r][1]
        if start <= eos_start < end:
            e += 1
            continue
        image_between = image_token is not None and image_token in text[end:eos_start]
        if r + 1 < len(regions):
            if end <= eos_start < regions[r + 1][0] and not image_between:
                regions[r][1] = eos_end
                e += 1
        elif not image_between:
            regions[r][1] = eos_end
            e += 1
        r += 1


class FinetuningSamples:
    """Records in, one padded sample each."""

    image_token: Optional[str] = None
    """The multimodal generator's image placeholder (an eos past it stays out of a turn); none here."""

    def __init__(self, tok: LoadedTokenizer, *, max_seq_length: int, min_sequence_len: int, use_ftfy: bool,
                 ftfy_normalizer: str, sep_token, truncate_to_msl, chat_template: Optional[str] = None,
                 end_of_turn_token: Optional[str] = None, inverted_mask: bool = False) -> None:
        self.tok = tok
        self.msl = max_seq_length
        self.inverted_mask = inverted_mask
        self.min_len = min_sequence_len
        self.use_ftfy = use_ftfy
        self.normalizer = ftfy_normalizer
        self.sep = sep_token if sep_token is not ... else (tok.sep_token or _DEFAULT_SEP)
        self.truncate = truncate_to_msl
        self.eos = tok.eos_token if tok.eos_id is not None else tok.backend.id_to_token(tok.pad_id)
        self.template = chat_template or tok.chat_template
        self.end_of_turn = end_of_turn_token

    def document(self, entries: list[dict], stats: dict, where: str = "") -> list[np.ndarray]:
        """The sample one record's hook output makes (none or one); adds its counts to ``stats``."""
        if not entries:  # the hook dropped the record (an odd number of chat turns, ...): not counted
            return []
        count_record(stats)
        if entries[0]["type"] not in ("prompt", "completion"):
            return self._chat(entries, stats, where)
        text, regions, length = "", [], 0
        for turn in entries:
            role = turn["type"]
            for part in turn["content"]:
                (_, value), = part.items()
                if not value:
                    stats["raw_docs_skipped"] += 1
                    return []
                cleaned = clean_and_count(value, self.use_ftfy, self.normalizer, stats)
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
        return self._finish(ids, offsets, regions, stats, where)

    def _chat(self, entries: list[dict], stats: dict, where: str) -> list[np.ndarray]:
        """A conversation through the tokenizer's chat template: loss on what the assistant said (and the
        end-of-turn token after it), none on the system prompt, the user and the template's own text."""
        messages, regions = [], []
        for index, turn in enumerate(entries):
            (_, value), = turn["content"][0].items()
            if not value:
                stats["raw_docs_skipped"] += 1
                return []
            cleaned = clean_and_count(value, self.use_ftfy, self.normalizer, stats)
            marker = f"<{index}_text>"  # finds the turn in the rendered text, then removed
            messages.append({"role": turn["type"], "content": marker + cleaned})
            regions.append((marker, len(cleaned), 1 if turn["type"] == "assistant" else 0))
        text, spans, turn_token = self._chat_spans(messages, regions, where)
        ids, offsets = self.tok.encode(text, add_special_tokens=False)
        return self._finish(ids, offsets, spans, stats, where, turn_token)

    def _chat_spans(self, messages: list[dict], regions: list[tuple], where: str) -> tuple[str, list, list]:
        """The rendered conversation with its turn markers removed, each region's character span ``[start, end,
        loss]`` and whether it takes the end-of-turn token after it (:meth:`_extend_turns`)."""
        text = self.render(messages, where)
        spans, at = [], 0
        for marker, length, loss in regions:
            start = text.find(marker, at)
            if start == -1:
                raise DataError(f"data preprocess --config: the chat template dropped a turn of {where}; use a template "
                                "that writes every message's content")
            text = text.replace(marker, "")
            spans.append([start, start + length, loss])
            at = start + length
        return text, spans, self._extend_turns(text, spans)

    def _extend_turns(self, text: str, spans: list[list]) -> list[bool]:
        """Which turns also take the one token after them (the template's end-of-turn), by the vendor's rule:
        with at most one eos in the text, a turn followed by template text, and the last turn when text follows."""
        eos = self.end_of_turn or self.eos
        _extend_to_eos(text, spans, eos, self.image_token)
        count = 0 if not eos else len(_occurrences(text, eos, spans[0][0] if spans else 0))
        extra = [False] * len(spans)
        if count > 1:
            return extra
        for i in range(1, len(spans)):
            if spans[i - 1][1] != spans[i][0]:
                extra[i - 1] = True
            if i == len(spans) - 1 and spans[i][1] < len(text):
                extra[i] = True
        return extra

    def render(self, messages: list[dict], where: str) -> str:
        return render_chat(self.template, messages, self.tok.special_tokens, where)

    def _finish(self, ids: list[int], offsets: list, spans: list[list], stats: dict, where: str,
                turn_token: Optional[list[bool]] = None) -> list[np.ndarray]:
        mask = [0] * len(ids)
        at = 0
        for index, (start, end, loss) in enumerate(spans):
            first = _token_start(offsets, at, start)
            last = None if first is None else _token_end(offsets, first, end)
            if last is None:
                raise DataError(f"data preprocess --config: the tokenizer's offsets do not cover a region of {where}; "
                                "use a Hugging Face fast tokenizer")
            if turn_token and turn_token[index]:
                last += 1
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
        return self._sample(ids, mask, stats)

    def _sample(self, ids: list[int], mask: list[int], stats: dict) -> list[np.ndarray]:
        """The padded sample of a kept record's tokens and loss mask, counted."""
        n = len(ids) - 1
        pad = self.msl - n
        sample = np.empty((3, self.msl), dtype=np.int32)
        sample[0] = ids[:-1] + [self.tok.pad_id] * pad
        sample[1] = mask[1:] + [0] * pad
        sample[2] = ids[1:] + [self.tok.pad_id] * pad
        if self.inverted_mask:  # processing.inverted_mask: 1 where no loss is taken (padding included), counted so
            sample[1] = sample[1] == 0
        sample_stats(sample, self.tok, self.msl, stats)
        return [sample]

    def rest(self) -> tuple[list[np.ndarray], dict]:
        """Finetuning carries nothing between records."""
        return [], {}
