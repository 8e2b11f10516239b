"""NLG samples (mode ``nlg``: E2E, DART, WebNLG) as the vendor's tool makes them: one record, one 3 x msl sample.

The records are already tokenized: ``context`` and ``completion`` (read_hook_kwargs' ``context_key`` /
``completion_key``, through the vendor's ``nlg_read_hook``) are lists of token ids; the tokenizer gives only
eos_id / pad_id / vocab_size to data_params.json. The rules are Release 2.10's NLGTokenGenerator (which reads
``"n_examples": successful``, an undefined name, so the vendor's own tool raises NameError on every record;
tools/vendor_oracle/record_preprocess.py supplies the 1 the code means and records its output):

* input_ids = context + completion[:-1], labels = context[1:] + completion, both padded with 0 to msl;
* the loss mask (row ``attention_mask``) is 1 at the positions whose label is a completion token, from
  len(context) - 1 to len(context) - 2 + len(completion), except position 0, which the vendor's mask
  arithmetic (positions compared with 0) always leaves 0: a one-token context loses its first label;
* num_masked_tokens counts msl - len(completion), num_pad_tokens msl - len(input_ids), num_tokens msl;
  no characters are counted (there is no text).

Where the vendor's arithmetic fails or makes a meaningless row, cs-run stops with the record's ``file:line``
instead: a value that is not a list of token ids, an empty context or completion, more than msl + 1 tokens
(the vendor's np.pad raises), an id outside the tokenizer's vocabulary.
"""

from __future__ import annotations

import numpy as np

from cs_run.errors import DataError

__all__ = ["NlgSamples"]


def _token_ids(value, name: str, vocab_size: int, where: str) -> list[int]:
    """``value`` as a list of token ids of the tokenizer, or one error naming the record and how to fix it."""
    if value is None or value == "":  # the record lacks the key (the vendor's hook reads it as "")
        raise DataError(f"data preprocess --config: {where} has no {name} (read_hook_kwargs.{name}_key names the "
                        "record's key); add it or fix the key")
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        shown = repr(value) if len(repr(value)) < 40 else repr(value)[:37] + "..."
        raise DataError(f"data preprocess --config: {where} has {name} {shown}, not a list of token ids; mode nlg "
                        "reads pre-tokenized records (tokenize the text first, e.g. with the tokenizer the config names)")
    if not value:
        raise DataError(f"data preprocess --config: {where} has an empty {name}; mode nlg needs at least one "
                        f"{name} token (remove the record)")
    bad = next((v for v in value if not 0 <= v < vocab_size), None)
    if bad is not None:
        raise DataError(f"data preprocess --config: {where} has {name} token id {bad}, outside the tokenizer's "
                        f"vocabulary (0..{vocab_size - 1}); tokenize with the tokenizer the config names")
    return value


class NlgSamples:
    """Records in, one 3-row sample each (no packing, nothing carried between records)."""

    def __init__(self, *, max_seq_length: int, vocab_size: int) -> None:
        self.msl = max_seq_length
        self.vocab_size = vocab_size

    def document(self, entries: list[dict], stats: dict, where: str = "") -> list[np.ndarray]:
        """The sample one record's hook output (a context turn, a completion turn) makes; adds its counts."""
        turns = {turn.get("type"): turn["content"][0]["text"] for turn in entries}
        context = _token_ids(turns.get("context"), "context", self.vocab_size, where)
        completion = _token_ids(turns.get("completion"), "completion", self.vocab_size, where)
        n_inputs = len(context) + len(completion) - 1
        if n_inputs > self.msl:
            raise DataError(f"data preprocess --config: {where} has {len(context)} context and {len(completion)} "
                            f"completion tokens, {n_inputs} inputs over max_seq_length {self.msl} (the vendor's tool "
                            "stops there too); raise processing.max_seq_length or shorten the record")
        sample = np.zeros((3, self.msl), dtype=np.int32)
        sample[0, :n_inputs] = context + completion[:-1]
        sample[2, :n_inputs] = context[1:] + completion
        first = len(context) - 1  # the label of this position is the completion's first token
        sample[1, max(first, 1):first + len(completion)] = 1  # position 0 stays 0, as the vendor's mask
        stats["processed_files"] += 1
        stats["successful_files"] += 1
        stats["num_pad_tokens"] += self.msl - n_inputs
        stats["num_masked_tokens"] += self.msl - len(completion)
        stats["loss_valid_tokens"] += int(sample[1].sum())
        stats["num_tokens"] += self.msl
        stats["n_examples"] += 1
        return [sample]

    def rest(self) -> tuple[list[np.ndarray], dict]:
        """NLG carries nothing between records."""
        return [], {}
