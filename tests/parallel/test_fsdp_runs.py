"""sharding: fsdp on 2 replicas (gloo, CPU) of a tiny Llama-style decoder trains the same losses and weights as one
unsharded process (AdamW, clipping, warmup + cosine, 30 steps), loads a one-file checkpoint into its shards
(each replica reading its rows only), stops both replicas with one error when a row only one of them reads
is damaged, and writes sharded checkpoints an unsharded process resumes exactly; the combinations that do
not work are one params error each. Tolerance: see fsdp_helpers."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner
from fsdp_helpers import STEPS, assert_same_losses, assert_same_weights, launch, losses, tensors, train_here, write_params

import cs_run as cstorch
from cs_run.frontends.cli import cli
from tests.h5_damage import flip_a_byte_of


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """One unsharded process: the reference, with its initial weights saved (checkpoint_0)."""
    root = tmp_path_factory.mktemp("one")
    params = write_params(root / "params.yaml", checkpoint_steps=15, save_initial_checkpoint=True)
    train_here(params, root / "md")
    return root


def test_two_sharded_replicas_load_their_start_and_train_like_one_process(one, tmp_path):
    # Another seed, so the replicas' own initial weights differ: only a load into the shards of the one
    # process's checkpoint_0 can give its weights at step 30.
    params = write_params(tmp_path / "params.yaml", checkpoint_steps=15, seed=2)
    result = launch(params, tmp_path / "md", "--num_csx", 2, "--sharding", "fsdp", "--checkpoint_path",
                    one / "md" / "checkpoint_0.mdl")
    assert "sharding: fsdp over 2 replica(s), 2 block(s)" in result.stderr
    assert "checkpoint_0.mdl: this replica read its rows of" in result.stderr  # not the whole file
    assert_same_losses(one / "md", tmp_path / "md")
    assert_same_weights(one / "md" / "checkpoint_30.mdl", tmp_path / "md" / "checkpoint_30.mdl")
    # The sharded run's checkpoint is a folder of 2 shards: an unsharded process resumes from it.
    assert sorted(p.name for p in (tmp_path / "md" / "checkpoint_15.mdl").iterdir()) == [
        "index.json", "shard_00000_of_00002.h5", "shard_00001_of_00002.h5"]
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(tmp_path / "md" / "checkpoint_15.mdl", resumed / "checkpoint_15.mdl")
    train_here(params, resumed)
    assert len(losses(resumed)) == 15
    # eval-all of the sharded run's model_dir: both folders, found, checked against the model and loaded.
    evaluated = train_here(params, tmp_path / "md", command="eval-all")
    assert "checkpoint_15.mdl" in evaluated and "checkpoint_30.mdl" in evaluated, evaluated
    assert_same_weights(one / "md" / "checkpoint_30.mdl", resumed / "checkpoint_30.mdl")
    assert tensors(one / "md" / "checkpoint_30.mdl").keys() == tensors(resumed / "checkpoint_30.mdl").keys()


@pytest.mark.sweep  # a 2-replica launch, ~23 s on CI's 2 cores: make test-sweep (the joined check of the rows is
# shown in one process in make test: tests/checkpoint/test_rows.py)
def test_a_damaged_row_only_one_replica_reads_of_a_one_file_start_stops_both(one, tmp_path):
    """The one process's checkpoint_0.mdl with a byte flipped in the last row of a weight, a row replica 1
    of 2 reads and replica 0 does not: neither replica's rows alone can be checked, their CRC32 pieces
    joined can; both stop at the load with one line naming the file and key, and nothing is written."""
    damaged = tmp_path / "damaged.mdl"
    shutil.copy(one / "md" / "checkpoint_0.mdl", damaged)
    key, weight = next((f"model.{k}", v) for k, v in cstorch.load(damaged)["model"].items() if v.dim() == 2)
    flip_a_byte_of(damaged, key, weight.nbytes - 1)
    result = launch(write_params(tmp_path / "params.yaml"), tmp_path / "md", "--num_csx", 2, "--sharding", "fsdp",
                    "--checkpoint_path", damaged, check=False)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr[-3000:]
    assert f"checkpoint '{damaged}' is damaged: checksum mismatch in '{key}'" in errors[0], errors[0]
    assert not list((tmp_path / "md").glob("checkpoint_*"))


def test_accumulated_micro_batches_reduce_scatter_once_per_step_and_train_like_one_process(tmp_path):
    """2 micro-batches per step on 2 sharded replicas: FSDP2 reduce-scatters each group's gradients once per
    step (set_requires_gradient_sync(False) for the first micro-batch), 3 groups (2 blocks and the model)
    x 30 steps, not twice that; the losses and weights are one process's with the same accumulation
    (tolerance of fsdp_helpers: the same sums in another order)."""
    train_here(write_params(tmp_path / "one.yaml", grad_accum_steps=2, checkpoint_steps=STEPS), tmp_path / "one")
    counting = write_params(tmp_path / "two.yaml", grad_accum_steps=2, checkpoint_steps=STEPS,
                            runner="sharded_runners:CountingReduceScatterRunner")  # patches the replicas only
    launch(counting, tmp_path / "two", "--num_csx", 2, "--sharding", "fsdp")
    # Replica 1 built the model on the meta device (no parameter storage before sharding, counted as modules
    # register their parameters), replica 0 the whole model; the shards got replica 0's values, so both
    # trained like the one process (above and below: the same losses and weights).
    whole = sum(t.nbytes for t in {id(p): p for p in cstorch.load(tmp_path / "one" / f"checkpoint_{STEPS}.mdl")["model"].values()}.values())
    assert [int((tmp_path / f"built_{rank}").read_text()) for rank in range(2)] == [whole, 0]
    assert_same_losses(tmp_path / "one", tmp_path / "two")
    assert_same_weights(tmp_path / "one" / f"checkpoint_{STEPS}.mdl", tmp_path / "two" / f"checkpoint_{STEPS}.mdl")
    for rank in range(2):
        assert (tmp_path / f"reduce_scatters_{rank}").read_text() == f"{STEPS} {3 * STEPS}"
    assert_same_losses(tmp_path / "one", tmp_path / "two")
    assert_same_weights(tmp_path / "one" / f"checkpoint_{STEPS}.mdl", tmp_path / "two" / f"checkpoint_{STEPS}.mdl")


@pytest.mark.parametrize("args, message", [
    (["--device", "CSX", "--sharding", "fsdp"],
     "runconfig.sharding: fsdp with --device CSX: the CSX engine traces data-parallel steps only (sharding: fsdp "
     "and offload: cpu run on --device CPU and GPU; --device CSX runs sharding: none)"),
    (["--device", "CSX", "--offload", "cpu"], "runconfig.offload: cpu with --device CSX"),
    (["--num_csx", "2", "--offload", "cpu"],
     "runconfig.offload: cpu with 2 data-parallel replicas (sharding: none): offload keeps FSDP2's sharded state in "
     "host memory; set runconfig.sharding: fsdp (--sharding fsdp) or num_csx: 1"),
    (["--sharding", "zero3"], "'zero3' is not one of"),
    (["--offload", "disk"], "'disk' is not one of"),
])
def test_combinations_that_do_not_work_are_one_params_error(tmp_path, args, message):
    params = write_params(tmp_path / "params.yaml")
    result = CliRunner().invoke(cli, ["train", "--params", str(params), "--model_dir", str(tmp_path / "md"), *args])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert not (tmp_path / "md").exists()
