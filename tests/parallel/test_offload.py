"""offload: cpu on one replica (FSDP2's CPUOffloadPolicy over a process group of one) trains a tiny Llama-style decoder
exactly as the plain process does: on the CPU device the host memory is the device's, so the policy moves
nothing, and one replica's FSDP2 reduces nothing, so the same float ops run in the same order (tolerance:
none, bit-identical). What the policy does with an accelerator (pinned host memory, a copy per block to
the device) is not testable here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from fsdp_helpers import HARD_LIMIT, STEPS, launch, losses, tensors, train_here, write_params


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


TRAINER_SCRIPT = """
import sys
sys.path.insert(0, {here!r})
import cs_run as cstorch
from fsdp_helpers import MODEL, OPTIMIZER, STEPS

trainer = cstorch.Trainer(device="CPU", model_dir={model_dir!r}, model=MODEL, optimizer=OPTIMIZER, seed=1,
                          loop={{"num_steps": STEPS}}, checkpoint={{"steps": STEPS}}, sharding="fsdp", offload="cpu")
trainer.fit({{"data_fn": "tokens_data:build", "batch_size": 8}})
"""


def test_the_trainers_sharding_and_offload_arguments_train_as_the_params_keys_do(tmp_path):
    """cstorch.Trainer(sharding="fsdp", offload="cpu") is runconfig.sharding / offload: one replica (its own
    process: it joins a group of one) trains the same weights as the plain run, bit for bit (see above), and
    writes the sharded checkpoint form."""
    params = write_params(tmp_path / "params.yaml")
    train_here(params, tmp_path / "plain")
    script = TRAINER_SCRIPT.format(here=str(Path(__file__).parent), model_dir=str(tmp_path / "trainer"))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HARD_LIMIT,
                          env={**env, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sharding: fsdp over 1 replica(s), 2 block(s) + the model's other parameters; offload: cpu" in done.stderr
    written = tmp_path / "trainer" / f"checkpoint_{STEPS}.mdl"
    assert written.is_dir()  # the sharded form: a folder
    plain, sharded = tensors(tmp_path / "plain" / f"checkpoint_{STEPS}.mdl"), tensors(written)
    assert plain.keys() == sharded.keys()
    for key, value in plain.items():
        assert torch.equal(value, sharded[key]), key
