"""sharding: fsdp on 4 replicas (gloo, CPU; more processes than cores here, so the slowest of these
tests) of a tiny gpt2, from scratch: the same losses and weights as one unsharded process over 30 steps
with AdamW, clipping and warmup + cosine. Tolerance: see fsdp_helpers."""

from __future__ import annotations

import pytest
from fsdp_helpers import assert_same_losses, assert_same_weights, launch, train_here, write_params


@pytest.mark.slow  # 4 processes on the 2 shared cores: ~60 s idle, ~100 s loaded; its startup is most of it
def test_four_sharded_replicas_train_like_one_process(tmp_path):
    params = write_params(tmp_path / "params.yaml")
    train_here(params, tmp_path / "one")
    result = launch(params, tmp_path / "four", "--num_csx", 4, "--sharding", "fsdp")
    assert "sharding: fsdp over 4 replica(s)" in result.stderr
    assert_same_losses(tmp_path / "one", tmp_path / "four")
    assert_same_weights(tmp_path / "one" / "checkpoint_30.mdl", tmp_path / "four" / "checkpoint_30.mdl")
