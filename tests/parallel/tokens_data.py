"""A data function for the sharding tests: learnable token streams in one fixed global order, each
replica streaming its contiguous share of every global batch, so N replicas' step t together sees
exactly the batch one process sees at step t (the comparison of 1 and N replicas needs that; the
GPT HDF5 processor shards by file instead). No padding: every replica's loss averages the same number
of tokens, so the mean of the replicas' losses is the one process's loss."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

import cs_run as cstorch

SAMPLES, MSL, VOCAB = 96, 16, 64


def _samples(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (SAMPLES, 1), generator=g)
    tokens = (start + torch.arange(MSL + 1)) % VOCAB
    return {"input_ids": tokens[:, :-1].int(), "attention_mask": torch.ones(SAMPLES, MSL, dtype=torch.int32),
            "labels": tokens[:, 1:].int()}


def build(split: str, batch_size: int) -> DataLoader:
    """The replica's share of each global batch of ``batch_size``, in the global order."""
    n, rank = cstorch.distributed.num_streamers(), cstorch.distributed.get_streaming_rank()
    local = cstorch.distributed.get_streaming_batch_size(batch_size)
    data = _samples(0 if split == "train" else 1)
    mine = [i for i in range(SAMPLES - SAMPLES % batch_size) if (i % batch_size) // local == rank]
    assert len(mine) * n == SAMPLES - SAMPLES % batch_size
    rows = [{k: v[i] for k, v in data.items()} for i in mine]
    return DataLoader(rows, batch_size=local, shuffle=False, drop_last=True)
