"""Text generation with the decoder LM (:class:`~cs_run.models.common.decoder.DecoderLM`) and its KV cache.

Each batch of prompts is left-padded to its longest prompt and prefilled in one call of
:meth:`DecoderLM.decode`, then decoded one token per call; ``batch_size`` 1 decodes each prompt alone
(the same tokens: positions and masks follow each sequence, see :mod:`~cs_run.models.common.kv_cache`).
The next token is the argmax (greedy), or with ``do_sample`` drawn from the logits after, in
transformers' order, ``temperature``, ``top_k`` and ``top_p`` (nucleus) filtering, from a generator
seeded with ``seed``. A sequence stops at one of ``eos_token_ids`` (kept as its last token), at the first
occurrence of one of ``stop_strings`` in its decoded text (the text is cut before it), or after
``max_new_tokens``; a batch stops when all of its sequences have.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from cs_run.models.common.decoder import DecoderLM
from cs_run.models.common.kv_cache import KVCache

logger = logging.getLogger(__name__)

__all__ = ["GenerationConfig", "Generation", "filter_logits", "generate"]


@dataclass(frozen=True)
class GenerationConfig:
    """How to decode; checked once when made (ValueError naming the field)."""

    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    pad_token_id: int = 0
    batch_size: Optional[int] = None  # prompts decoded together; None: all of them

    def __post_init__(self) -> None:
        object.__setattr__(self, "eos_token_ids", tuple(self.eos_token_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be >= 1, got {self.max_new_tokens}")
        if not self.temperature > 0 or not math.isfinite(self.temperature):
            raise ValueError(f"temperature: must be > 0, got {self.temperature} (greedy decoding: leave do_sample off)")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k: must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        if any(not s for s in self.stop_strings):
            raise ValueError("stop_strings: an empty string would stop every sequence at once")


@dataclass
class Generation:
    """One prompt's result: the new ``tokens`` (an eos, or the token that completed a stop string, is the last),
    their ``text`` (None without a decoder; cut before a stop string) and why it ended: ``eos``,
    ``stop_string`` or ``length``."""

    tokens: list[int]
    text: Optional[str]
    finish_reason: str


def filter_logits(logits: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
    """``logits`` [batch, vocab] divided by the temperature, with -inf outside the ``top_k`` largest and outside
    the smallest set of largest-probability tokens whose mass reaches ``top_p`` (the token crossing it kept)."""
    logits = logits.float() / config.temperature
    if config.top_k is not None and config.top_k < logits.shape[-1]:
        kth = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p is not None and config.top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        before = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1) - torch.softmax(ordered, dim=-1)
        drop = before >= config.top_p  # the mass of the tokens above already reaches top_p
        drop[..., 0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    return logits


def _next_tokens(logits: torch.Tensor, config: GenerationConfig, generator: Optional[torch.Generator]) -> torch.Tensor:
    if not config.do_sample:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(filter_logits(logits, config), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _stop_cut(text: str, stops: Sequence[str]) -> Optional[int]:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _check_lengths(lm: DecoderLM, prompts: Sequence[Sequence[int]], config: GenerationConfig) -> None:
    limit = lm.embedding_layer.max_position_embeddings
    vocab = lm.embedding_layer.word_embeddings.num_embeddings
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {i}: empty; give at least one token")
        if len(prompt) + config.max_new_tokens > limit:
            raise ValueError(f"prompt {i}: {len(prompt)} tokens plus max_new_tokens {config.max_new_tokens} pass the "
                             f"model's max_position_embeddings ({limit}); shorten it or lower max_new_tokens")
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt {i}: token id {bad[0]} is outside the model's vocabulary (0..{vocab - 1}); "
                             "use the tokenizer the model was trained with")


@torch.no_grad()
def generate(lm: DecoderLM, prompts: Sequence[Sequence[int]], config: GenerationConfig,
             decode: Optional[Callable[[list[int]], str]] = None) -> list[Generation]:
    """Continue each prompt (a list of token ids) with ``lm`` (in eval mode for the call), in batches of
    ``config.batch_size``. ``decode`` (token ids -> text) gives each result's text; stop strings need it.

    Raises:
        ValueError: a prompt that is empty, holds a token outside the vocabulary or, with ``max_new_tokens``,
            does not fit the model's positions; stop strings without ``decode``.
    """
    if config.stop_strings and decode is None:
        raise ValueError("stop_strings: need a tokenizer to decode the generated text")
    _check_lengths(lm, prompts, config)
    was_training = lm.training
    lm.eval()
    generator = None
    if config.do_sample:
        generator = torch.Generator(device=lm.lm_head.weight.device)
        generator.manual_seed(config.seed if config.seed is not None else torch.seed())
    size = config.batch_size or max(len(prompts), 1)
    results: list[Generation] = []
    start, new_tokens = time.perf_counter(), 0
    try:
        for first in range(0, len(prompts), size):
            batch = _generate_batch(lm, prompts[first:first + size], config, decode, generator)
            results += batch
            new_tokens += sum(len(g.tokens) for g in batch)
            elapsed = time.perf_counter() - start
            logger.info("Generated %d/%d prompts, %d new tokens in %.2f s (%.1f tokens/s)", len(results),
                        len(prompts), new_tokens, elapsed, new_tokens / max(elapsed, 1e-9))
    finally:
        lm.train(was_training)
    return results


def _generate_batch(lm: DecoderLM, prompts: Sequence[Sequence[int]], config: GenerationConfig,
                    decode: Optional[Callable[[list[int]], str]],
                    generator: Optional[torch.Generator]) -> list[Generation]:
    device = lm.lm_head.weight.device
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), config.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest, dtype=torch.long)
    for row, prompt in enumerate(prompts):  # left padding: every sequence's last token in the last column
        ids[row, longest - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
        mask[row, longest - len(prompt):] = 1
    ids, mask = ids.to(device), mask.to(device)
    cache = KVCache(len(prompts), longest + config.max_new_tokens, device)
    logits = lm.decode(ids, cache, mask, last_only=True)[:, -1]
    out: list[list[int]] = [[] for _ in prompts]
    texts: list[Optional[str]] = [None] * len(prompts)
    reasons: list[Optional[str]] = [None] * len(prompts)
    eos = set(config.eos_token_ids)
    for step in range(config.max_new_tokens):
        chosen = _next_tokens(logits, config, generator).tolist()  # host sync: stop checks need the tokens
        for row, token in enumerate(chosen):
            if reasons[row] is not None:
                continue
            out[row].append(token)
            if token in eos:
                reasons[row] = "eos"
            elif config.stop_strings:
                text = decode(out[row])
                cut = _stop_cut(text, config.stop_strings)
                if cut is not None:
                    reasons[row], texts[row] = "stop_string", text[:cut]
        if all(r is not None for r in reasons) or step == config.max_new_tokens - 1:
            break
        step = torch.tensor([[out[row][-1] if reasons[row] is None else config.pad_token_id]
                             for row in range(len(prompts))], dtype=torch.long, device=device)
        logits = lm.decode(step, cache)[:, -1]
    results = []
    for row, tokens in enumerate(out):
        text = texts[row] if texts[row] is not None else (decode(tokens) if decode is not None else None)
        results.append(Generation(tokens, text, reasons[row] or "length"))
    return results
