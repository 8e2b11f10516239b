"""DPO samples (prompt / chosen / rejected) as the vendor's tool makes them: one record, one 6 x msl sample.

Rows: chosen input_ids, attention_mask, labels, then the same for rejected (data_params.json's
``features``). Each side is the tokenizer's chat template on [user: prompt, assistant: answer], the
answer marked by ``dataset.response_delimiter`` (default ``<response>``) to find where the prompt ends;
the marker is then removed. Labels are the inputs shifted by one with the prompt's positions set to
pad; the attention mask is 0 over the prompt. Over max_seq_length, the prompt keeps its last
``max_prompt_length`` tokens and then the answer is cut (Release 2.10's DPOTokenGenerator, whose rules
these are; its ``dataset.chat_template`` is read and not applied, so here too the tokenizer's own
template renders the record).
"""

from __future__ import annotations

import numpy as np

from cs_run.errors import DataError

from ._finetuning import render_chat
from ._pretraining import clean_text
from ._tokenizer import LoadedTokenizer

__all__ = ["DPO_FEATURES", "DpoSamples"]

DPO_FEATURES = ["chosen_input_ids", "chosen_attention_mask", "chosen_labels", "rejected_input_ids",
                "rejected_attention_mask", "rejected_labels"]


class DpoSamples:
    """Records in, one 6-row sample each."""

    def __init__(self, tok: LoadedTokenizer, *, max_seq_length: int, max_prompt_length: int, use_ftfy: bool,
                 ftfy_normalizer: str, response_delimiter: str) -> None:
        self.tok = tok
        self.msl = max_seq_length
        self.max_prompt = max_prompt_length
        self.use_ftfy = use_ftfy
        self.normalizer = ftfy_normalizer
        self.delimiter = response_delimiter

    def _ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)[0]

    def _split(self, prompt: str, full: str) -> tuple[list[int], list[int]]:
        """Prompt and answer token ids of ``full``: the prompt's own tokens, one fewer where the tokenizer
        merged the prompt's last token into the answer."""
        full_ids, prompt_ids = self._ids(full), self._ids(prompt)
        start = len(prompt_ids)
        if prompt_ids != full_ids[:start]:
            start -= 1
        return full_ids[:start], full_ids[start:]

    def document(self, entries: list[dict], stats: dict, where: str = "") -> list[np.ndarray]:
        """The sample one record's hook output makes (none or one); adds its counts to ``stats``."""
        texts = {"prompt": "", "chosen": "", "rejected": ""}
        for turn in entries:
            value = (turn["content"][0]["text"] or "").strip()
            texts[turn["type"]] = value if turn["type"] == "prompt" else self.delimiter + value
        stats["processed_files"] += 1
        if not texts["chosen"] or not texts["rejected"]:
            stats["discarded_files"] += 1
            return []
        sides = []
        for answer in (texts["chosen"], texts["rejected"]):
            messages = [{"role": "user", "content": texts["prompt"]}, {"role": "assistant", "content": answer}]
            sides.append(render_chat(self.tok.chat_template, messages, self.tok.special_tokens, where))
        raw_chars = sum(len(s) for s in sides)
        raw_bytes = sum(len(s.encode("utf-8")) for s in sides)
        stats["raw_chars_count"] += raw_chars
        stats["raw_bytes_count"] += raw_bytes
        if self.use_ftfy:
            sides = [clean_text(s, True, self.normalizer) for s in sides]
        stats["normalized_chars_count"] += sum(len(s) for s in sides) if self.use_ftfy else raw_chars
        stats["normalized_bytes_count"] += sum(len(s.encode("utf-8")) for s in sides) if self.use_ftfy else raw_bytes
        cut = sides[0].rfind(self.delimiter)
        if cut == -1:
            stats["discarded_files"] += 1
            return []
        prompt = sides[0][:cut]
        sides = [s[:cut] + s[cut + len(self.delimiter):] for s in sides]
        parts = [list(self._split(prompt, s)) for s in sides]  # [prompt ids, answer ids] per side
        longest = max(len(answer) for _, answer in parts)
        for part in parts:
            if len(part[0]) + longest > self.msl:
                part[0] = part[0][-self.max_prompt:]
        for part in parts:
            if len(part[0]) + longest > self.msl:
                part[1] = part[1][: self.msl - len(part[0])]
        rows, pad_total, loss_valid = [], 0, 0
        for prompt_ids, answer_ids in parts:
            ids = prompt_ids + answer_ids
            labels = ids[1:]
            n_prompt = len(prompt_ids) - 1
            labels[:n_prompt] = [self.tok.pad_id] * n_prompt  # (a Python slice: n_prompt -1 drops all but one)
            mask = [1] * len(ids)
            for tokens, pad_value in ((ids, self.tok.pad_id), (mask, 0), (labels, self.tok.pad_id)):
                row = [pad_value] * self.msl
                row[: len(tokens)] = tokens
                pad_total += self.msl - len(tokens)
                rows.append(row)
            rows[-2][:n_prompt] = [0] * n_prompt
            loss_valid += self.msl - n_prompt
        if any(len(r) != self.msl for r in rows):
            raise DataError(f"data preprocess --config: {where} makes a DPO row of another length than max_seq_length "
                            f"{self.msl}; raise max_seq_length")
        stats["successful_files"] += 1
        stats["num_pad_tokens"] += pad_total
        stats["num_masked_tokens"] += 2 * self.msl - loss_valid
        stats["loss_valid_tokens"] += loss_valid
        stats["num_tokens"] += 6 * self.msl
        stats["n_examples"] += 1
        return [np.array(rows, dtype=np.int32)]

    def rest(self) -> tuple[list[np.ndarray], dict]:
        """DPO carries nothing between records."""
        return [], {}
