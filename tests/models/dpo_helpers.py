"""Tiny DPO shards in the Model Zoo's layout, for tests/models/test_dpo.py.

The layout follows Release_2.10.0 ``src/cerebras/modelzoo/data_preparation/data_preprocessing/
dpo_token_generator.py`` (``DPOTokenGenerator.encode``): lines 428-448 (labels: the prompt-and-answer tokens
shifted left by one, the first ``len(prompt) - 1`` set to the pad id), 451-473 (each row padded to
max_seq_length, with the pad id, or 0 for the masks), 477-483 (the mask's first ``len(prompt) - 1``
positions 0: no loss on the prompt), 496-501 (the six rows stacked in the order chosen_input_ids,
chosen_attention_mask, chosen_labels, rejected_input_ids, rejected_attention_mask, rejected_labels, one
sample ``[1, 6, msl]``), written as the GPT shards are: dataset ``data`` ``[n, 6, msl]`` and attribute
``n_examples``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PAD_ID = 0


def encode_pair(prompt: list[int], chosen: list[int], rejected: list[int], msl: int) -> np.ndarray:
    """One sample ``[6, msl]`` as the vendor's token generator builds it."""
    rows = []
    for answer in (chosen, rejected):
        tokens = prompt + answer
        labels = tokens[1:]
        labels[: len(prompt) - 1] = [PAD_ID] * (len(prompt) - 1)
        mask = [1] * len(tokens)
        padded = {}
        for key, values, pad in (("input_ids", tokens, PAD_ID), ("attention_mask", mask, 0), ("labels", labels, PAD_ID)):
            row = [pad] * msl
            row[: len(values)] = values
            padded[key] = row
        padded["attention_mask"][: len(prompt) - 1] = [0] * (len(prompt) - 1)
        rows += [padded["input_ids"], padded["attention_mask"], padded["labels"]]
    return np.stack([np.array(r) for r in rows], axis=0)


def write_dpo_shards(folder, pairs: int = 4, seed: int = 0, msl: int = 16, vocab: int = 64,
                     name: str = "data-0.h5") -> Path:
    """``folder/name``: ``pairs`` seeded preference pairs of prompts (3-5 tokens) and answers (2-8 tokens)."""
    import h5py  # noqa: PLC0415 (h5py loads where used)

    rng = np.random.default_rng(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    samples = []
    for _ in range(pairs):
        prompt = rng.integers(1, vocab, int(rng.integers(3, 6))).tolist()
        chosen, rejected = (rng.integers(1, vocab, int(rng.integers(2, msl - len(prompt) + 1))).tolist()
                            for _ in range(2))
        samples.append(encode_pair(prompt, chosen, rejected, msl))
    with h5py.File(folder / name, "w") as f:
        f.create_dataset("data", data=np.stack(samples).astype(np.int32))
        f.attrs["n_examples"] = pairs
    return folder / name
