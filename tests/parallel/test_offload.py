"""offload: cpu on one replica (FSDP2's CPUOffloadPolicy over a process group of one) trains a tiny Llama-style decoder
exactly as the plain process does: on the CPU device the host memory is the device's, so the policy moves
nothing, and one replica's FSDP2 reduces nothing, so the same float ops run in the same order (tolerance:
none, bit-identical). What the policy does with an accelerator (pinned host memory, a copy per block to
the device) is not testable here."""

from __future__ import annotations

import torch
from fsdp_helpers import launch, losses, tensors, train_here, write_params


def test_one_offloaded_replica_trains_the_same_weights(tmp_path):
    params = write_params(tmp_path / "params.yaml")
    train_here(params, tmp_path / "plain")
    result = launch(params, tmp_path / "offload", "--offload", "cpu")  # its own process: it joins a group of one
    assert "sharding: fsdp over 1 replica(s), 2 block(s) + the model's other parameters; offload: cpu" in result.stderr
    assert losses(tmp_path / "plain") == losses(tmp_path / "offload")
    plain, offload = tensors(tmp_path / "plain" / "checkpoint_30.mdl"), tensors(tmp_path / "offload" / "checkpoint_30.mdl")
    assert plain.keys() == offload.keys()
    for key, value in plain.items():
        assert torch.equal(value, offload[key]), key
