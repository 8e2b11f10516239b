"""The gpt2 example on 2 replicas over shards of different sizes (97 samples in files of 20 and 17, which the
Model Zoo's file-by-file split gave 60 and 37 and cs-run refused): data parallel and sharded (fsdp) both
train, each replica on DistributedSampler(drop_last=True)'s share (48 samples, 24 steps an epoch at 2 a
replica), a resume continues the same evened stream across the epoch's end, and fsdp trains what data
parallel trains. Tolerance: fsdp_helpers' (the same sums in another order: FSDP2's reduce-scatter against
DDP's all-reduce; AdamW compounds the rounding over 30 steps)."""

from __future__ import annotations

import pytest
import torch
from fsdp_helpers import ATOL, RTOL, assert_same_losses, launch, losses, tensors
from torch.utils.data import DistributedSampler

from tests.examples.gpt2_helpers import random_samples, tiny_params, write_vendor_shards

STEPS = 30
OPTIMIZER = {"optimizer_type": "AdamW", "max_gradient_norm": 1.0, "weight_decay": 0.01, "learning_rate": [
    {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 2e-3, "total_iters": 5},
    {"scheduler": "CosineDecay", "initial_learning_rate": 2e-3, "end_learning_rate": 1e-4, "total_iters": 25}]}


@pytest.fixture(scope="module")
def params(tmp_path_factory):
    root = tmp_path_factory.mktemp("even")
    write_vendor_shards(root / "train", random_samples(97, 16, 64), per_file=20)
    write_vendor_shards(root / "val", random_samples(16, 16, 64, seed=1), per_file=8)
    return tiny_params(root / "params.yaml", root / "train", root / "val", optimizer=OPTIMIZER,
                       model={"dropout_rate": 0.0, "attention_dropout_rate": 0.0},
                       runconfig={"max_steps": STEPS, "log_steps": 1, "checkpoint_steps": 0})


@pytest.mark.slow  # four 2-replica launches, ~60 s on 2 cores
def test_uneven_shards_train_on_two_replicas_resume_on_the_same_stream_and_fsdp_equals_data_parallel(params, tmp_path):
    per_epoch = len(DistributedSampler(range(97), num_replicas=2, rank=0, shuffle=False, drop_last=True)) // 2
    straight = launch(params, tmp_path / "dp", "--num_csx", 2)
    assert f"Training {STEPS} steps (global step 0 -> {STEPS}), {per_epoch} per epoch" in straight.stderr
    assert "48 of the 97 samples to each of 2 streamers (the last 1 left out" in straight.stderr
    # stopped at step 20 (an epoch and 8 steps into the next) and resumed from checkpoint_20: the same stream
    launch(params, tmp_path / "resumed", "--num_csx", 2, "--max_steps", 20)
    launch(params, tmp_path / "resumed", "--num_csx", 2)
    assert losses(tmp_path / "dp")[20:] == losses(tmp_path / "resumed")[20:]
    a, b = tensors(tmp_path / "dp" / f"checkpoint_{STEPS}.mdl"), tensors(tmp_path / "resumed" / f"checkpoint_{STEPS}.mdl")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)  # bit for bit
    launch(params, tmp_path / "fsdp", "--num_csx", 2, "--sharding", "fsdp")
    assert_same_losses(tmp_path / "dp", tmp_path / "fsdp")
    sharded = tensors(tmp_path / "fsdp" / f"checkpoint_{STEPS}.mdl")
    assert sharded.keys() == a.keys()
    for key in a:
        torch.testing.assert_close(sharded[key], a[key], atol=ATOL, rtol=RTOL, msg=key)
