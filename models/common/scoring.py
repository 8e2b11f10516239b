"""Log-likelihoods of continuations under the decoder LM: what an evaluation harness asks of a model
(lm-evaluation-harness' ``loglikelihood`` and, over its rolling windows, ``loglikelihood_rolling``).

A request is (context tokens, continuation tokens); its answer is the summed log-probability of the
continuation given the context and whether greedy decoding would have produced exactly that continuation.
As lm-evaluation-harness' Hugging Face backend does, the model reads the last ``max_length + 1`` tokens of
context + continuation minus the last one, so a long context loses its start. Requests are batched longest
first and right-padded: causal attention keeps the padding out of every real position.
"""

from __future__ import annotations

import logging
import time
from typing import Sequence

import torch
import torch.nn.functional as F

from cs_run.models.common.decoder import DecoderLM

logger = logging.getLogger(__name__)

__all__ = ["loglikelihoods"]


@torch.no_grad()
def loglikelihoods(lm: DecoderLM, requests: Sequence[tuple[Sequence[int], Sequence[int]]], max_length: int,
                   batch_size: int = 8) -> list[tuple[float, bool]]:
    """(log-probability of the continuation, whether it is the greedy one) of each (context, continuation).

    Raises:
        ValueError: a request with an empty continuation, or with neither context nor a continuation of two
            tokens (nothing to condition the first token on).
    """
    inputs = []
    for i, (context, continuation) in enumerate(requests):
        if not continuation:
            raise ValueError(f"request {i}: empty continuation; nothing to score")
        whole = list(context) + list(continuation)
        if len(whole) < 2:
            raise ValueError(f"request {i}: a continuation of one token needs a context token before it")
        inputs.append(whole[-(max_length + 1):][:-1])
    order = sorted(range(len(requests)), key=lambda i: -len(inputs[i]))
    device = lm.lm_head.weight.device
    results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
    was_training = lm.training
    lm.eval()
    start = time.perf_counter()
    try:
        for first in range(0, len(order), batch_size):
            rows = order[first:first + batch_size]
            width = len(inputs[rows[0]])
            ids = torch.zeros(len(rows), width, dtype=torch.long)
            for r, i in enumerate(rows):
                ids[r, :len(inputs[i])] = torch.tensor(inputs[i], dtype=torch.long)
            out = lm(ids.to(device))
            logprobs = F.log_softmax((out[0] if isinstance(out, tuple) else out).float(), dim=-1).cpu()
            for r, i in enumerate(rows):
                continuation = torch.tensor(list(requests[i][1]), dtype=torch.long)
                end = len(inputs[i])
                scores = logprobs[r, end - len(continuation):end]
                chosen = scores.gather(-1, continuation[:, None]).squeeze(-1)
                results[i] = (float(chosen.sum()), bool((scores.argmax(-1) == continuation).all()))
            if (first // batch_size) % 20 == 0 or first + batch_size >= len(order):
                done = min(first + batch_size, len(order))
                logger.info("Scored %d/%d requests in %.1f s", done, len(order), time.perf_counter() - start)
    finally:
        lm.train(was_training)
    return results
