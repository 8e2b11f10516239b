"""sharding: fsdp on 4 replicas (gloo, CPU; more processes than cores here, so the slowest of these
tests) of a tiny Llama-style decoder, from scratch, in train-and-eval: the same losses, weights and evaluation as one
unsharded process over 30 steps with AdamW, clipping, warmup + cosine and 2 accumulated micro-batches
(FSDP2 reduce-scatters their summed gradients once per step; the sum of the averages is the average of the sums).
Tolerance: see fsdp_helpers; the evaluation is printed to 5 decimals, where the runs agree."""

from __future__ import annotations

import pytest
from fsdp_helpers import assert_same_losses, assert_same_weights, launch, train_here, write_params


@pytest.mark.slow  # 4 processes on the 2 shared cores: ~60 s idle, ~100 s loaded; its startup is most of it
def test_four_sharded_replicas_train_like_one_process(tmp_path):
    params = write_params(tmp_path / "params.yaml", grad_accum_steps=2)
    one = train_here(params, tmp_path / "one", command="train-and-eval")
    result = launch(params, tmp_path / "four", "--num_csx", 4, "--sharding", "fsdp", command="train-and-eval")
    assert "sharding: fsdp over 4 replica(s)" in result.stderr
    evaluation = [line for line in one.splitlines() if line.startswith("eval/")]
    assert len(evaluation) == 3 and evaluation == [line for line in result.stdout.splitlines() if line.startswith("eval/")]
    assert_same_losses(tmp_path / "one", tmp_path / "four")
    assert_same_weights(tmp_path / "one" / "checkpoint_30.mdl", tmp_path / "four" / "checkpoint_30.mdl")
