"""Sharded checkpoints of a real run: 4 sharded replicas (gloo, CPU) of a tiny Llama-style decoder write each checkpoint as
a folder of 4 shards; its step-15 checkpoint resumes on 2 sharded replicas, on 1 (FSDP2 over a group of
one) and unsharded, each reaching the uninterrupted 4-replica run's step-30 losses and weights; and its
step-30 checkpoint converts to one .mdl whose every leaf equals the all-gathered weights bit for bit (and
to Hugging Face, the same tensors as from that .mdl).

Tolerances: the conversion is exact (torch.equal: the same bytes, rearranged). The resumed runs start from
exactly the saved state but continue with 2, 1 or 0-way sharding: each step's gradient is the same sum in
another order (4 vs 2 vs 1 partial means reduce-scattered), so float32 rounding (~6e-8 relative per
operation) differs and AdamW compounds it over the 15 steps: the tolerance of fsdp_helpers (atol 2e-6,
rtol 1e-5). Observed: largest weight difference 7e-9 (2 replicas) and 1.1e-8 (1 and unsharded), largest
loss difference 3.6e-7.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from fsdp_helpers import ATOL, RTOL, assert_same_weights, launch, losses, tensors, train_here, write_params
from safetensors.torch import load_file

from cs_run.frontends.cli import cli
from tests.h5_damage import flip_a_data_byte


@pytest.mark.slow  # 4, 2 and 1 replica processes on the 2 shared cores: ~3 min loaded, mostly their startup
def test_four_sharded_replicas_checkpoint_resumes_on_two_one_and_unsharded_and_converts_exactly(tmp_path):
    four = tmp_path / "four"
    gathering = write_params(tmp_path / "gathering.yaml", checkpoint_steps=15, runner="sharded_runners:GatheredRunner")
    launch(gathering, four, "--num_csx", 4, "--sharding", "fsdp")
    start = four / "checkpoint_15.mdl"
    index = json.loads((start / "index.json").read_text())
    assert index["world_size"] == 4 and sorted(p.name for p in start.iterdir()) == [
        "index.json", *(f"shard_{r:05d}_of_00004.h5" for r in range(4))]

    # One .mdl file from the 4 shards: every leaf equals FSDP2's all-gather of the live tensors exactly.
    whole = tmp_path / "whole.mdl"
    result = CliRunner().invoke(cli, ["checkpoint", "convert", str(four / "checkpoint_30.mdl"), str(whole)])
    assert result.exit_code == 0, result.output
    converted, gathered = tensors(whole), tensors(four / "gathered_30.mdl")
    assert converted.keys() == gathered.keys()
    for key, value in gathered.items():
        assert torch.equal(converted[key], value), key
    # ... and to Hugging Face through llama's converter, from the folder as from the one file: the same tensors.
    for src, dst in ((four / "checkpoint_30.mdl", tmp_path / "hf_folder"), (whole, tmp_path / "hf_file")):
        result = CliRunner().invoke(cli, ["checkpoint", "convert", str(src), str(dst), "--to", "hf", "--params",
                                          str(four / "params_resolved.yaml")])
        assert result.exit_code == 0, result.output
    from_folder, from_file = (load_file(tmp_path / name / "model.safetensors") for name in ("hf_folder", "hf_file"))
    assert from_folder.keys() == from_file.keys() and all(torch.equal(v, from_file[k]) for k, v in from_folder.items())

    params = write_params(tmp_path / "params.yaml", checkpoint_steps=15)
    resumes = {"two": ("--num_csx", 2, "--sharding", "fsdp"), "one": ("--sharding", "fsdp"), "unsharded": ()}
    for name, args in resumes.items():
        if name == "unsharded":
            train_here(params, tmp_path / name, "--checkpoint_path", start)
        else:
            launch(params, tmp_path / name, "--checkpoint_path", start, *args)
        assert_same_weights(four / "checkpoint_30.mdl", tmp_path / name / "checkpoint_30.mdl")
        torch.testing.assert_close(torch.tensor(losses(tmp_path / name)), torch.tensor(losses(four)[15:]),
                                   atol=ATOL, rtol=RTOL, msg=name)


def test_a_data_parallel_run_saves_over_a_sharded_checkpoint_of_the_same_step(tmp_path):
    """The step-3 checkpoint of a run is converted to a folder of 2 shards in another model_dir; a fresh
    one-process run there (``--resume none``) saves its own step 3 over that folder: one file, the same
    tensors as the first run's (same seed, same data: bit for bit), and nothing left beside it."""
    params = write_params(tmp_path / "params.yaml", checkpoint_steps=3, max_steps=3)
    train_here(params, tmp_path / "first")
    folder = tmp_path / "again" / "checkpoint_3.mdl"
    result = CliRunner().invoke(cli, ["checkpoint", "convert", str(tmp_path / "first" / "checkpoint_3.mdl"),
                                      str(folder), "--to", "sharded", "--shards", "2"])
    assert result.exit_code == 0 and folder.is_dir(), result.output
    train_here(params, tmp_path / "again", "--resume", "none")
    assert folder.is_file()
    first, again = tensors(tmp_path / "first" / "checkpoint_3.mdl"), tensors(folder)
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    assert [p.name for p in folder.parent.iterdir() if "checkpoint" in p.name] == ["checkpoint_3.mdl"]


@pytest.mark.sweep  # a 4- and a 2-replica launch, ~46 s on 2 cores: make test-sweep (the row reads and the joined
# checksums are also checked in one process by tests/checkpoint/test_sharded.py, which make test runs)
def test_two_shards_resume_on_four_replicas_reading_rows_and_a_damaged_shard_stops_them_all(tmp_path):
    """One process's step-3 checkpoint, converted to 2 shards, resumes on 4 sharded replicas (each reads
    half of one shard's rows) and reaches the one process's step-6 losses and weights (tolerance of
    fsdp_helpers). The same folder with a byte flipped in shard 1 stops 2 replicas at the load with one
    line naming the shard: the damage is found by the replicas' checksums joined, the same on each."""
    params = write_params(tmp_path / "params.yaml", checkpoint_steps=3, max_steps=6)
    train_here(params, tmp_path / "one")
    two = tmp_path / "two.mdl"
    result = CliRunner().invoke(cli, ["checkpoint", "convert", str(tmp_path / "one" / "checkpoint_3.mdl"), str(two),
                                      "--to", "sharded", "--shards", "2"])
    assert result.exit_code == 0, result.output
    launch(params, tmp_path / "four", "--num_csx", 4, "--sharding", "fsdp", "--checkpoint_path", two)
    assert_same_weights(tmp_path / "one" / "checkpoint_6.mdl", tmp_path / "four" / "checkpoint_6.mdl")
    torch.testing.assert_close(torch.tensor(losses(tmp_path / "four")), torch.tensor(losses(tmp_path / "one")[3:]),
                               atol=ATOL, rtol=RTOL)

    damaged = tmp_path / "damaged.mdl"
    shutil.copytree(two, damaged)
    flip_a_data_byte(damaged / "shard_00001_of_00002.h5")
    result = launch(params, tmp_path / "stopped", "--num_csx", 2, "--sharding", "fsdp", "--checkpoint_path", damaged,
                    check=False)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr[-3000:]
    assert "shard_00001_of_00002.h5' is damaged: checksum mismatch" in errors[0], errors[0]
    assert not list((tmp_path / "stopped").glob("checkpoint_*"))
