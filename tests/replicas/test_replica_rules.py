"""The replica rules that need no second process: the batch split, the sharding of fc_mnist's data, the
launcher's refusals and its one failure line, and that only ordinal 0 writes."""

from __future__ import annotations

import contextlib
import json
import signal

import pytest
import torch
from click.testing import CliRunner
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.utils.data import RandomSampler

import cs_run as cstorch
from cs_run import replicas
from cs_run.backend import _reset_for_tests
from cs_run.data.processors.mnist import ShardSampler
from cs_run.errors import ParamsError
from cs_run.exits import report
from cs_run.frontends.cli import cli


def invoke(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


@pytest.mark.parametrize("replicas_n", [1, 2, 3, 4, 8])
def test_split_batch_is_the_vendor_rule_for_every_batch(replicas_n):
    for batch in range(1, 40):
        if batch % replicas_n == 0:
            assert replicas.split_batch(batch, replicas_n) * replicas_n == batch
            continue
        with pytest.raises(ValueError) as caught:
            replicas.split_batch(batch, replicas_n)
        suggested = [int(v) for v in caught.value.args[0].split("use ")[1].split(" or ")]
        assert suggested and all(v % replicas_n == 0 and v > 0 for v in suggested)  # each suggestion splits
        assert all(abs(v - batch) < replicas_n for v in suggested)  # and is a nearest one
    for bad in (0, -4, 2.0, True, None):
        with pytest.raises(ValueError):
            replicas.split_batch(bad, replicas_n)


def test_a_batch_that_does_not_split_is_a_params_error_naming_the_key_and_line(tmp_path):
    result = invoke("train", "--num_csx", 2, "--model_dir", tmp_path / "md", "--set", "train_input.batch_size=63")
    assert result.exit_code == 2
    assert "Error: params: train_input.batch_size: 63 is the global batch of 2 replicas" in result.output
    assert "use 62 or 64" in result.output and "(set on the command line)" in result.output
    assert not (tmp_path / "md").exists()  # refused before anything was written or launched


def test_every_front_door_reaches_the_launcher(tmp_path, monkeypatch):
    # Inside pytest the launcher refuses to rerun the command; reaching that refusal shows the front door
    # passed num_csx through. (The real launches are in test_replica_runs.py.)
    refused = "replicas rerun this process's command in 2 processes"
    result = invoke("train", "--num_csx", 2, "--model_dir", tmp_path / "cli")
    assert result.exit_code == 2 and refused in result.output
    with _reset_for_tests():
        trainer = cstorch.Trainer(backend={"backend_type": "CPU", "cluster_config": {"num_csx": 2}},
                                  model_dir=str(tmp_path / "trainer"),
                                  model={"name": "fc_mnist", "depth": 1, "hidden_size": 8},
                                  optimizer={"optimizer_type": "SGD", "learning_rate": 0.1}, loop={"num_steps": 2})
        with pytest.raises(ParamsError, match=refused):
            trainer.fit({"batch_size": 8})
    with _reset_for_tests():
        backend = cstorch.backend("CPU", cluster_config=cstorch.distributed.ClusterConfig(num_csx=2))
        with pytest.raises(ParamsError, match=refused):
            cstorch.compile(torch.nn.Linear(2, 2), backend)


def test_a_launcher_world_size_other_than_num_csx_is_refused(monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "localhost", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ParamsError, match=r"num_csx: 2, but the launcher started 3 processes \(WORLD_SIZE=3\)"):
        replicas.start(2, "CPU")
    with pytest.raises(ParamsError, match="set --num_csx 3"):
        replicas.start(1, "CPU")


@pytest.mark.parametrize("shards", [1, 2, 3, 4])
def test_shards_together_are_the_single_process_batches(shards):
    # One step's replica batches (batch B / N each) hold exactly the samples of one process's batch B.
    n, batch = 103, 12
    orders = []
    for shard in range(shards):
        base = RandomSampler(range(n), generator=torch.Generator().manual_seed(5))
        orders.append(list(ShardSampler(base, shards, shard, even=True)))
    single = list(RandomSampler(range(n), generator=torch.Generator().manual_seed(5)))
    assert len({len(o) for o in orders}) == 1 and len(orders[0]) == len(ShardSampler(range(n), shards, 0, even=True))
    per = batch // shards
    for step in range(n // batch):
        together = sorted(i for o in orders for i in o[step * per:(step + 1) * per])
        assert together == sorted(single[step * batch:(step + 1) * batch])
    uneven = [list(ShardSampler(range(n), shards, s, even=False)) for s in range(shards)]
    assert sorted(i for o in uneven for i in o) == list(range(n))  # evaluation: every sample exactly once
    assert [len(o) for o in uneven] == [len(ShardSampler(range(n), shards, s, even=False)) for s in range(shards)]


def _failure(tmp_path, rank, exitcode, recorded=None, peer_lost=False):
    path = tmp_path / f"error_{rank}_{exitcode}.json"
    if recorded is not None:
        line, code, when = recorded
        path.write_text(json.dumps({"message": line, "timestamp": int(when),
                                    "cs_run": {"line": line, "exit_code": code, "time": when, "peer_lost": peer_lost}}))
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(path))


def test_the_launcher_names_the_replica_that_failed_first(tmp_path):
    stopped = "all replicas were stopped; rerun the same command to resume from the newest checkpoint"
    # Replica 1 raised first; replica 0 then failed in the collective (later, also recorded): replica 1 is named.
    error = ChildFailedError("x", {0: _failure(tmp_path, 0, 1, ("RuntimeError: Connection closed by peer", 1, 20.5)),
                                   1: _failure(tmp_path, 1, 2, ("params: train_input.batch_size: bad", 2, 20.1))})
    assert replicas._failure_line(error, 2) == (
        f"replica 1 of 2 failed: params: train_input.batch_size: bad ({stopped})", 2)
    # A replica killed by a signal records nothing: named with its signal, exit code 1.
    error = ChildFailedError("x", {1: _failure(tmp_path, 1, -signal.SIGKILL)})
    assert replicas._failure_line(error, 2) == (f"replica 1 of 2 was killed by signal SIGKILL ({stopped})", 1)
    # Replica 0 noticed the dead peer in the all-reduce before the agent saw the death: the death is named.
    lost = ("replica 0 of 2 lost its peers in a collective", 1, 10.0)
    error = ChildFailedError("x", {0: _failure(tmp_path, 0, 1, lost, peer_lost=True),
                                   1: _failure(tmp_path, 1, -signal.SIGKILL)})
    assert replicas._failure_line(error, 2) == (f"replica 1 of 2 was killed by signal SIGKILL ({stopped})", 1)
    # The agent stopped replica 0 with SIGTERM after replica 1's death (the same whole-second time on both):
    # killed by it or exiting 143 after checkpointing, it is a consequence and replica 1 is named.
    for stopped_code in (-signal.SIGTERM, -signal.SIGINT, 143, 130):
        error = ChildFailedError("x", {0: _failure(tmp_path, 0, stopped_code), 1: _failure(tmp_path, 1, -signal.SIGKILL)})
        error.failures[0].timestamp = error.failures[1].timestamp = 1_000
        assert replicas._failure_line(error, 2) == (f"replica 1 of 2 was killed by signal SIGKILL ({stopped})", 1)
    # ...but a replica stopped by SIGTERM is still named before one that only lost its peers.
    error = ChildFailedError("x", {0: _failure(tmp_path, 0, 1, lost, peer_lost=True),
                                   1: _failure(tmp_path, 1, -signal.SIGTERM)})
    assert replicas._failure_line(error, 2) == (f"replica 1 of 2 was killed by signal SIGTERM ({stopped})", 1)
    # Interrupted replicas (Ctrl-C: exit 130) logged where they stopped themselves: no line, the same code.
    error = ChildFailedError("x", {0: _failure(tmp_path, 0, 130), 1: _failure(tmp_path, 1, 130)})
    assert replicas._failure_line(error, 2) == ("", 130)
    error = ChildFailedError("x", {0: _failure(tmp_path, 0, 3)})
    assert replicas._failure_line(error, 4) == (
        f"replica 0 of 4 exited with code 3 (its output is above; {stopped})", 3)


def test_a_lost_peer_is_one_line_not_an_internal_error(monkeypatch, capsys):
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:53406.")
    assert replicas.lost_peer(gloo) and replicas.lost_peer(torch.distributed.DistBackendError("x"))
    assert not replicas.lost_peer(RuntimeError("shape mismatch")) and not replicas.lost_peer(ValueError("timed out"))
    assert report(gloo) == 1
    assert capsys.readouterr().err.splitlines() == [
        "Error: replica 0 of 2 lost its peers in a collective ([gloo/transport/tcp/pair.cc:553] Connection closed by "
        "peer [127.0.0.1]:53406.); another replica failed or did not answer within runconfig.collective_timeout"]


def test_only_ordinal_zero_writes_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    cstorch.save({"w": torch.ones(2)}, tmp_path / "by_ordinal_1.mdl")
    assert not (tmp_path / "by_ordinal_1.mdl").exists()
    monkeypatch.setenv("RANK", "0")
    cstorch.save({"w": torch.ones(2)}, tmp_path / "by_ordinal_0.mdl")
    assert torch.equal(cstorch.load(tmp_path / "by_ordinal_0.mdl")["w"], torch.ones(2))


def test_replica_loaders_must_have_equal_lengths_and_split_batches(monkeypatch, caplog):
    from cs_run.params import InputParams
    from cs_run.runners import base

    loader = torch.utils.data.DataLoader(range(64), batch_size=8)
    monkeypatch.setattr(replicas, "world_size", lambda: 2)
    monkeypatch.setattr(replicas, "sum_values", lambda *v: tuple(2 * x for x in v))  # the other has as many
    base._check_replica_loader(loader, InputParams(batch_size=4))
    assert "did not split" not in caplog.text and not caplog.records
    base._check_replica_loader(loader, InputParams(batch_size=8))  # the loader ignored the split
    assert "train_input.batch_size=8 is the global batch of 2 replicas, but the data function's loader yields 8 " \
           "per replica (a global batch of 16)" in caplog.text
    monkeypatch.setattr(replicas, "sum_values", lambda *v: tuple(2 * x + 1 for x in v))  # the other has one more
    with pytest.raises(ParamsError, match="the 2 replicas' train loaders differ in length .this replica's has 8 "
                                          "batches, all together 17."):
        base._check_replica_loader(loader, InputParams(batch_size=4))


def test_accumulated_micro_batches_all_reduce_once(batches):
    """Every micro-batch but the last runs inside the strategy's holding_gradients (DDP's no_sync for data
    parallel), so the replicas reduce once per step; the data-parallel strategy holds a DDP module's
    gradients with its own no_sync and has nothing to hold on a bare module."""
    from cs_run.parallel import Strategy
    from cs_run.runners._step import StepConfig, train_step

    class Recording(Strategy):
        held = False

        @contextlib.contextmanager
        def holding_gradients(self, model):
            self.held = True
            try:
                yield
            finally:
                self.held = False

    class Replica(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 4)
            self.synced = []

        def forward(self, batch):
            x, y = batch
            self.synced.append(not strategy.held)
            return torch.nn.functional.cross_entropy(self.fc(x), y)

    strategy = Recording()
    model = Replica()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_step(model, batches[:3], optimizer, None, None, StepConfig(), strategy)
    assert model.synced == [False, False, True]
    train_step(model, batches[:1], optimizer, None, None, StepConfig(), strategy)
    assert model.synced[3:] == [True]

    class FakeDDP(torch.nn.parallel.DistributedDataParallel):  # no process group: only no_sync is asked for
        def __init__(self):
            torch.nn.Module.__init__(self)

        def no_sync(self):
            return "ddp's no_sync"
    assert Strategy().holding_gradients(FakeDDP()) == "ddp's no_sync"
    assert isinstance(Strategy().holding_gradients(model), contextlib.nullcontext)


def _finished(tmp_path, rank, exitcode):
    """A replica whose run completed (cs_run.replicas.record_finished wrote its file) and then failed on its way out."""
    path = tmp_path / f"finished_{rank}.json"
    path.write_text(json.dumps({"message": "finished", "timestamp": 20, "cs_run": {"finished": True, "time": 20.0}}))
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file=str(path))


DONE = "after the run had completed: its last checkpoint is written, nothing to rerun"


@pytest.mark.parametrize("failures,line", [
    # finished, then killed on the way out (the SIGABRT of a teardown): no rerun advice, the run reached its end
    (lambda p: {1: _finished(p, 1, -signal.SIGABRT)}, f"replica 1 of 2 was killed by signal SIGABRT ({DONE})"),
    (lambda p: {0: _finished(p, 0, 1)}, f"replica 0 of 2 exited with code 1 (its output is above; {DONE})"),
    # one replica finished and died, the other then lost its peer: still the completed run
    (lambda p: {0: _failure(p, 0, 1, ("replica 0 of 2 lost its peers in a collective", 1, 30.0), peer_lost=True),
                1: _finished(p, 1, -signal.SIGABRT)}, f"replica 1 of 2 was killed by signal SIGABRT ({DONE})"),
])
def test_a_replica_that_fails_after_its_run_completed_is_not_told_to_rerun(tmp_path, failures, line):
    assert replicas._failure_line(ChildFailedError("x", failures(tmp_path)), 2) == (line, 1)


class _KilledMidWrite(BaseException):
    """Stands for the replica being killed (SIGKILL) while it writes its record."""


@pytest.mark.parametrize("earlier", [None, "finished"], ids=["no-earlier-record", "over-a-finished-record"])
def test_a_replica_killed_while_writing_its_record_leaves_a_file_the_agent_can_read(tmp_path, monkeypatch, earlier):
    """The agent parses a replica's error file once the replica has exited (torch's ProcessFailure); a file
    left half-written or empty was a JSONDecodeError in the launcher instead of the job's one line."""
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    if earlier:
        replicas.record_finished()
    before = path.read_text() if earlier else None

    def dies_halfway(data, fh):
        fh.write(json.dumps(data)[:7])
        fh.flush()
        raise _KilledMidWrite

    monkeypatch.setattr(replicas.json, "dump", dies_halfway)
    with pytest.raises(_KilledMidWrite):
        replicas.record_failure("ValueError: bad", 1)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["error.json"] if earlier else [])  # no stray temp file
    if earlier:
        assert path.read_text() == before
        failure = ProcessFailure(local_rank=0, pid=1, exitcode=-signal.SIGKILL, error_file=str(path))
        assert replicas._record(failure) == {"finished": True, "time": json.loads(before)["cs_run"]["time"]}
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    replicas.record_failure("ValueError: bad", 3)  # a write that completes replaces it whole
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=3, error_file=str(path))
    assert replicas._own_record(failure)["line"] == "ValueError: bad"
