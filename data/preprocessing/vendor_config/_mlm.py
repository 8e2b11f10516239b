"""Masked-LM samples as the vendor's tool writes them (mode pretraining, ``training_objective: mlm``: esm2).

The rules are Release 2.10's PretrainingTokenGenerator.process_mlm / mask_single_sequence, written down so a
change is seen. Each record is one sample, never packed or split:

* the text is tokenized with the tokenizer's special tokens, cut to ``max_seq_length`` (specials kept) and
  padded with the tokenizer's pad token; ``data`` is ``[input_ids, attention_mask]``;
* the positions that may be masked are those whose id is not the tokenizer's cls, pad, eos or unk; of them
  ``min(int(mlm_fraction * count), ceil(mlm_fraction * max_seq_length))`` are drawn with
  ``random.Random(seed).sample`` and sorted; for each, one ``random()`` draw: below 0.8 the token becomes
  mask, below 0.9 a random id (numpy's global RNG, seeded with ``seed``: ``choice`` over the vocabulary less
  ``excluded_tokens``, in the tokenizer's ``get_vocab()`` order), else it stays;
* ``labels`` is ``[labels]`` (the original id at the masked positions, ``ignore_index`` elsewhere), or with
  ``mlm_with_gather`` ``[labels, masked_lm_positions, masked_lm_mask]`` over ``ceil(mlm_fraction * msl)``
  slots (``ignore_index`` / 0 / 0 after the drawn ones).

The vendor's ``get_vocab()`` order is the vocabulary file's for a slow tokenizer (EsmTokenizer, what the esm2
config names); a fast tokenizer's comes from a Rust hash map and changes from one run of the vendor's tool to
the next, so no run reproduces its random replacements. cs-run takes the ids in order, which is the slow
tokenizer's order.
"""

from __future__ import annotations

import math
import random

import numpy as np

from cs_run.errors import ParamsError

from ._pretraining import clean_and_count
from ._tokenizer import LoadedTokenizer

__all__ = ["EXCLUDED_TOKENS", "MlmSamples", "check_keys", "features"]

EXCLUDED_TOKENS = ["<cls>", "<pad>", "<eos>", "<unk>", "<null_1>", "<mask>"]
"""dataset.excluded_tokens' default (ESM-2's special tokens): never a random replacement."""


def features(with_gather: bool) -> list[str]:
    """data_params.json's ``features`` (the vendor's names, in its order)."""
    return ["input_ids", "attention_mask", "labels"] + (["masked_lm_positions", "masked_lm_mask"] if with_gather
                                                        else [])


class MlmSamples:
    """Records in, ``(data, labels)`` samples out (the vendor's two HDF5 datasets)."""

    H5_KEYS = ("data", "labels")

    def __init__(self, tok: LoadedTokenizer, *, max_seq_length: int, seed: int, mlm_fraction: float,
                 with_gather: bool, ignore_index: int, excluded_tokens: list[str], use_ftfy: bool,
                 ftfy_normalizer: str, where: str, wikitext_detokenize: bool = False) -> None:
        ids = {name: tok.backend.token_to_id(tok.special_tokens[name]) if name in tok.special_tokens else None
               for name in ("cls_token", "pad_token", "eos_token", "unk_token", "mask_token")}
        for name in ("pad_token", "mask_token"):
            if ids[name] is None:
                raise ParamsError(f"data preprocess --config: training_objective mlm needs the tokenizer's {name} "
                                  f"({where}); name it in the tokenizer folder's tokenizer_config.json")
        self.tok, self.msl = tok, max_seq_length
        self.tok.backend.enable_truncation(max_length=max_seq_length)
        self.tok_pad, self.mask_id = ids["pad_token"], ids["mask_token"]
        self.special = {i for name, i in ids.items() if name != "mask_token" and i is not None}
        vocab = tok.backend.get_vocab(with_added_tokens=True)
        excluded = {vocab[t] for t in excluded_tokens if t in vocab}
        self.allowable = [i for i in sorted(vocab.values()) if i not in excluded]
        self.fraction, self.gather, self.ignore = mlm_fraction, with_gather, ignore_index
        self.max_predictions = math.ceil(mlm_fraction * max_seq_length)
        self.use_ftfy, self.normalizer, self.wikitext = use_ftfy, ftfy_normalizer, wikitext_detokenize
        self.rng = random.Random(seed)
        self.np_rng = np.random.RandomState(seed)  # the vendor seeds numpy's global RNG: the same stream

    def _mask(self, input_ids: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
        """(masked ids, positions, position mask, labels) by the vendor's draws, in its order."""
        ids = list(input_ids)
        can = [i for i, t in enumerate(input_ids) if t not in self.special]
        positions: list[int] = []
        labels = [] if self.gather else [self.ignore] * len(ids)
        k = min(int(self.fraction * len(can)), self.max_predictions)
        if k > 0:
            for pos in sorted(self.rng.sample(can, k=k)):
                original = ids[pos]
                draw = self.rng.random()
                if draw < 0.8:
                    ids[pos] = self.mask_id
                elif draw < 0.9:
                    ids[pos] = int(self.np_rng.choice(self.allowable))
                if self.gather:
                    positions.append(pos)
                    labels.append(original)
                else:
                    labels[pos] = original
        mask = [1] * len(positions)
        if self.gather:
            pad = self.max_predictions - len(positions)
            positions, mask, labels = positions + [0] * pad, mask + [0] * pad, labels + [self.ignore] * pad
        return ids, positions, mask, labels

    def document(self, entries: list[dict], stats: dict, where: str = "") -> list[tuple[np.ndarray, np.ndarray]]:
        """The one sample of a record's hook output (none for empty text); adds its counts to ``stats``."""
        parts = [clean_and_count(value, self.use_ftfy, self.normalizer, stats, self.wikitext)
                 for entry in entries for part in entry["content"] for value in part.values() if value]
        if len(parts) > 1:
            raise ParamsError(f"data preprocess --config: {where}: the read hook gave several text regions; "
                              "training_objective mlm takes one (text_read_hook)")
        if not parts:
            return []
        ids = self.tok.backend.encode(parts[0]).ids
        n = len(ids)
        ids, positions, mask, labels = self._mask(ids + [self.tok_pad] * (self.msl - n))
        data = np.array([ids, [1] * n + [0] * (self.msl - n)], dtype=np.int32)
        label_rows = [labels, positions, mask] if self.gather else [labels]
        non_pad = sum(1 for t in ids if t != self.tok.pad_id)
        stats["processed_files"] += 1
        stats["successful_files"] += 1
        stats["non_pad_tokens"] += non_pad
        stats["num_pad_tokens"] += self.msl - non_pad
        stats["num_tokens"] += self.msl
        stats["num_masked_tokens"] += ids.count(self.mask_id)
        stats["loss_valid_tokens"] += len(labels) - labels.count(self.ignore)
        stats["n_examples"] += 1
        return [(data, np.array(label_rows, dtype=np.int32))]

    def rest(self) -> tuple[list, dict]:
        """Nothing is carried between records."""
        return [], {}


def check_keys(dataset: dict, fail, typed) -> dict:
    """training_objective mlm's keys, checked: ``fail(key, problem, fix)`` makes the error, ``typed(key, kind,
    default)`` reads a typed key."""
    fraction = typed("mlm_fraction", (int, float), 0.15)
    if not 0.0 < fraction <= 1.0:
        raise fail("dataset.mlm_fraction", f"is {fraction}", "give a fraction in (0, 1]")
    excluded = dataset.get("excluded_tokens", EXCLUDED_TOKENS)
    if not isinstance(excluded, list) or not all(isinstance(t, str) for t in excluded):
        raise fail("dataset.excluded_tokens", f"is {excluded!r}", "give a list of token strings")
    return {"mlm_fraction": float(fraction), "with_gather": typed("mlm_with_gather", bool, False),
            "ignore_index": typed("ignore_index", int, -100), "excluded_tokens": list(excluded)}
