"""Ctrl-C and SIGTERM keep the work; run.log and model_dir/runs/ record every invocation and its end.

The signals are real: sent to a ``cs-run train`` subprocess from outside, or by a hook to its own process.
Each test sets the dispositions it starts from (``_python_default_signals``), whatever this process
inherited, and waits on what the child reports through a pipe, never on a sleep.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

import cs_run as cstorch
import cs_run.checkpoint.atomic as atomic
from cs_run import checkpoint
from cs_run.backend import _reset_for_tests
from cs_run.exits import error_text, exit_code
from cs_run.frontends.cli import cli
from cs_run.interrupts import Aborted, Interrupted, stop_on_signal
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner
from cs_run.summaries import read_scalar_rows

SIGNALLING = '''
import os, signal
from cs_run.runners import PyTorchCSRunner, PyTorchRunner


class Signalling:
    """At step PAUSE_AT: writes the step to the pipe REPORT_FD, then waits until the pipe GO_FD has a byte
    (the test signals in between). At step SIGNAL_AT: sends SEND_SIGNAL to its own process."""

    def on_train_batch_end(self, loss, epoch=None, step=None):
        super().on_train_batch_end(loss, epoch, step)
        if step == int(os.environ.get("PAUSE_AT", "-1")):
            os.write(int(os.environ["REPORT_FD"]), f"{step}\\n".encode())
            os.read(int(os.environ["GO_FD"]), 1)
        if step == int(os.environ.get("SIGNAL_AT", "-1")):
            os.kill(os.getpid(), getattr(signal, os.environ["SEND_SIGNAL"]))


class CpuRunner(Signalling, PyTorchRunner):
    pass


class CsxRunner(Signalling, PyTorchCSRunner):
    pass
'''


@pytest.fixture(autouse=True)
def _python_default_signals():
    """Every test starts from Python's own dispositions, set here explicitly: SIGINT raises
    KeyboardInterrupt, SIGTERM ends the process. This process may have inherited others (a parent that
    ignores SIGINT, as ``cmd &`` without job control does, leaves it SIG_IGN); they are restored after.
    A ``cs-run`` child started meanwhile gets SIG_DFL for both (a caught signal is reset at exec), so
    Python installs its default SIGINT handler there too."""
    inherited = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, handler in inherited.items():
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)


@pytest.fixture
def project(toy_project):
    (toy_project.parent / "signalling.py").write_text(SIGNALLING)
    sys.modules.pop("signalling", None)
    yield toy_project
    sys.modules.pop("signalling", None)


def flat(tree, prefix=""):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from flat(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from flat(value, f"{prefix}.{i}")
    else:
        yield prefix, tree


def assert_same_checkpoint(a: Path, b: Path) -> None:
    """Every leaf (weights, optimizer and schedule state, RNG states, data position) equal, bit for bit."""
    left, right = dict(flat(checkpoint.load(str(a)))), dict(flat(checkpoint.load(str(b))))
    assert left.keys() == right.keys()
    for key, value in left.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == right[key].dtype and torch.equal(value, right[key]), key
        elif isinstance(value, np.ndarray):
            assert value.dtype == right[key].dtype and np.array_equal(value, right[key]), key
        else:
            assert value == right[key], key


def cs_run_train(project, model_dir, *args, env=None, **popen):
    command = [str(Path(sys.executable).parent / "cs-run"), "train", "--params", str(project), "--model_dir", str(model_dir),
               "--runner", "signalling:CpuRunner", *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(project.parent), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=project.parent, **popen)


def records(model_dir):
    return [yaml.safe_load(p.read_text()) for p in sorted((model_dir / "runs").glob("*.yaml"))]


@pytest.mark.slow
def test_sigint_to_cs_run_train_saves_the_step_and_a_rerun_resumes_bit_identically(project, tmp_path):
    steps = 40
    whole = cs_run_train(project, tmp_path / "whole", "--max_steps", steps)
    # The interrupted run pauses after step 5 and says so on a pipe; SIGINT goes in while it waits, so
    # it lands mid-run at a known step however slow the machine. No periodic checkpoint before the end.
    split = tmp_path / "split"
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    run = cs_run_train(project, split, "--max_steps", steps, "--set", "runconfig.checkpoint_steps=0",
                       env={"PAUSE_AT": "5", "REPORT_FD": str(report_w), "GO_FD": str(go_r)}, pass_fds=(report_w, go_r))
    os.close(report_w)  # the child's ends
    os.close(go_r)
    with os.fdopen(report_r) as report, os.fdopen(go_w, "w") as go:
        # a bound for a hung child only (select returns as soon as the line or EOF arrives)
        assert select.select([report], [], [], 600)[0] and report.readline() == "5\n", run.communicate()
        run.send_signal(signal.SIGINT)
        go.write("x")  # after the signal: the child's handler has run before the step returns
    _, err = run.communicate(timeout=600)
    assert run.returncode == 130, err
    line = next(x for x in err.splitlines() if "interrupted" in x)
    n = int(line.split("at step ")[1].split(";")[0])
    assert n == 5
    saved = split / f"checkpoint_{n}.mdl"
    assert line.endswith(f"WARNING: interrupted (SIGINT) at step {n}; checkpoint {saved}; rerun to resume")
    assert "Error" not in err and "Traceback" not in err and err.endswith(line + "\n")  # the last word
    assert sorted(p.name for p in split.glob("checkpoint_*")) == [saved.name]
    assert line.split(": ", 1)[1] in (split / "run.log").read_text()
    [record] = records(split)
    assert (record["outcome"], record["first_step"], record["last_step"]) == ("interrupted", 0, n)

    rerun = cs_run_train(project, split, "--max_steps", steps)
    out, err = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, err
    assert f"Resuming from checkpoint {saved} at global step {n}" in err
    _, err = whole.communicate(timeout=600)
    assert whole.returncode == 0, err
    assert_same_checkpoint(split / f"checkpoint_{steps}.mdl", tmp_path / "whole" / f"checkpoint_{steps}.mdl")
    assert [(r["outcome"], r["first_step"], r["last_step"]) for r in records(split)] == \
        [("interrupted", 0, n), ("completed", n, steps)]


def run_in_process(project, model_dir, device="CPU", **overrides):
    params = load_params(project, {"runconfig.model_dir": str(model_dir), **overrides})
    runner = PyTorchBaseRunner.create(params, device=device,
                                      runner="signalling:CsxRunner" if device == "CSX" else "signalling:CpuRunner")
    return runner.run("train")


@pytest.mark.parametrize("device", ["CPU", "CSX"])
def test_sigterm_from_a_hook_saves_that_step_exits_143_and_resumes_exactly(project, tmp_path, monkeypatch, device):
    run_in_process(project, tmp_path / "whole", device, **{"runconfig.max_steps": 13})
    monkeypatch.setenv("SIGNAL_AT", "7")
    monkeypatch.setenv("SEND_SIGNAL", "SIGTERM")
    with pytest.raises(Interrupted) as stop:
        run_in_process(project, tmp_path / "split", device, **{"runconfig.max_steps": 13})
    assert (stop.value.step, stop.value.checkpoint) == (7, tmp_path / "split" / "checkpoint_7.mdl")
    assert exit_code(stop.value) == 143
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are the process's again
    monkeypatch.delenv("SIGNAL_AT")
    run_in_process(project, tmp_path / "split", device, **{"runconfig.max_steps": 13})
    assert_same_checkpoint(tmp_path / "split" / "checkpoint_13.mdl", tmp_path / "whole" / "checkpoint_13.mdl")


def test_a_second_sigint_aborts_and_leaves_the_last_complete_checkpoint(project, tmp_path, monkeypatch):
    md = tmp_path / "md"
    run_in_process(project, md, **{"runconfig.max_steps": 5})
    before = (md / "checkpoint_5.mdl").read_bytes(), (md / "checkpoint_5.mdl").stat().st_mtime_ns
    monkeypatch.setenv("SIGNAL_AT", "7")
    monkeypatch.setenv("SEND_SIGNAL", "SIGINT")
    real_fsync = atomic.fsync_path

    def second_ctrl_c_while_saving(path, directory=False):  # the temporary is written, not yet renamed
        if not directory:
            os.kill(os.getpid(), signal.SIGINT)
        real_fsync(path, directory)

    monkeypatch.setattr(atomic, "fsync_path", second_ctrl_c_while_saving)
    with pytest.raises(Aborted) as abort:
        run_in_process(project, md, **{"runconfig.max_steps": 10})
    assert exit_code(abort.value) == 130
    assert sorted(p.name for p in md.iterdir() if p.name.startswith(("checkpoint", ".checkpoint"))) == \
        ["checkpoint_5.mdl"]  # no checkpoint_7, no temporary
    assert ((md / "checkpoint_5.mdl").read_bytes(), (md / "checkpoint_5.mdl").stat().st_mtime_ns) == before
    log = (md / "run.log").read_text()
    assert "ERROR: Error: aborted by a second SIGINT" in log
    assert [r["outcome"] for r in records(md)] == ["completed", "aborted"]


def test_errors_and_nan_stops_reach_run_log_as_the_console_shows_them(project, tmp_path):
    md = tmp_path / "md"
    result = CliRunner().invoke(cli, ["train", "--params", str(project), "--model_dir", str(md),
                                      "--set", "train_input.nan_at=30"])
    assert result.exit_code == 1
    error = [x for x in result.output.splitlines() if x.startswith("Error:")]
    assert len(error) == 1 and "loss is nan at step" in error[0]
    assert f"ERROR: {error[0]}" in (md / "run.log").read_text()
    [record] = records(md)
    assert (record["outcome"], record["message"]) == ("failed", error[0])


def test_every_invocation_is_recorded_and_eval_keeps_the_training_params(project, tmp_path):
    md = tmp_path / "md"
    train = CliRunner().invoke(cli, ["train", "--params", str(project), "--model_dir", str(md), "--max_steps", "3"])
    assert train.exit_code == 0, train.output
    resolved = (md / "params_resolved.yaml").read_bytes()
    evaluate = CliRunner().invoke(cli, ["eval", "--params", str(project), "--model_dir", str(md),
                                        "--set", "eval_input.batch_size=2", "--eval_steps", "2"])
    assert evaluate.exit_code == 0, evaluate.output
    assert (md / "params_resolved.yaml").read_bytes() == resolved
    first, second = records(md)
    assert (first["mode"], first["device"], first["outcome"], first["last_step"]) == ("train", "CPU", "completed", 3)
    assert first["overrides"] == {"runconfig.max_steps": 3, "runconfig.model_dir": str(md)}
    assert second["mode"] == "eval" and second["overrides"] == {
        "eval_input.batch_size": 2, "runconfig.eval_steps": 2, "runconfig.model_dir": str(md)}
    assert first["cs_run"] == second["cs_run"] != "" and first["torch"] == torch.__version__
    assert first["params_file"] == str(project) and first["command"].startswith(Path(sys.argv[0]).name)
    assert {row.run for row in read_scalar_rows(md / "train")} == {first["run_id"]}


@pytest.mark.parametrize("before", [signal.default_int_handler, signal.SIG_IGN], ids=["default", "ignored"])
def test_signals_are_deferred_only_inside_the_block(before):
    """Inside the block SIGINT sets the flag whatever the process had; after it, the process's own
    disposition is back: Python's default raises KeyboardInterrupt, an inherited SIG_IGN still ignores."""
    signal.signal(signal.SIGINT, before)
    with stop_on_signal() as flag, stop_on_signal() as inner:
        assert inner is flag and not flag.requested
        os.kill(os.getpid(), signal.SIGINT)
        assert flag.signum == signal.SIGINT  # the handler ran, nothing was raised
        with pytest.raises(Aborted):
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGINT) is before
    if before is signal.SIG_IGN:
        os.kill(os.getpid(), signal.SIGINT)  # ignored: nothing happens
    else:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def custom_loop(backend_type, model_dir, num_steps, signal_at=None, after_checkpoint=False):
    """The vendor's custom loop shape; a step closure (or the loop body, after the checkpoint closure)
    sends SIGINT at step ``signal_at``."""
    with _reset_for_tests():
        backend = cstorch.backend(backend_type, artifact_dir=str(model_dir))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        compiled = cstorch.compile(model, backend)
        optimizer = cstorch.optim.SGD(compiled.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        data = [(torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(5)]

        @cstorch.trace
        def training_step(x, y):
            loss = torch.nn.functional.cross_entropy(compiled(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            return loss

        @cstorch.step_closure
        def maybe_signal(loss, step):
            if step == signal_at and not after_checkpoint:
                os.kill(os.getpid(), signal.SIGINT)

        @cstorch.checkpoint_closure
        def save(step):
            cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                         str(model_dir / f"checkpoint_{step}.mdl"))

        model_dir.mkdir(parents=True, exist_ok=True)
        executor = cstorch.utils.data.DataExecutor(data, num_steps=num_steps, checkpoint_steps=100)
        for step, (x, y) in enumerate(executor, start=1):
            loss = training_step(x, y)
            maybe_signal(loss, step)
            save(step)
            if step == signal_at and after_checkpoint:
                os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize("device", ["CPU", "CSX"])
@pytest.mark.parametrize("after_checkpoint, stop", [(False, 4), (True, 5)])
def test_custom_loop_sigint_ends_at_a_step_its_checkpoint_closure_saved(tmp_path, device, after_checkpoint, stop):
    # A signal before the step's checkpoint closure: that step saves; after it: the next step saves.
    with pytest.raises(Interrupted) as stopped:
        custom_loop(device, tmp_path / "split", 12, signal_at=4, after_checkpoint=after_checkpoint)
    assert stopped.value.step == stop and exit_code(stopped.value) == 130
    assert f"at step {stop}; the checkpoint closures of step {stop} ran" in str(stopped.value)
    assert sorted(p.name for p in (tmp_path / "split").glob("checkpoint_*")) == [f"checkpoint_{stop}.mdl"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # as _python_default_signals set it
    custom_loop(device, tmp_path / "whole", stop)  # the same steps, uninterrupted: the same state
    assert_same_checkpoint(tmp_path / "split" / f"checkpoint_{stop}.mdl",
                           tmp_path / "whole" / f"checkpoint_{stop}.mdl")


def test_a_ctrl_c_outside_a_training_loop_is_one_line_and_exit_130():
    assert (error_text(KeyboardInterrupt()), exit_code(KeyboardInterrupt())) == ("Error: interrupted", 130)
    stopped = Interrupted(signal.SIGTERM, 7, Path("md/checkpoint_7.mdl"))
    assert (error_text(stopped), exit_code(stopped)) == ("", 143)  # the run logged its own line
    assert str(stopped) == "interrupted (SIGTERM) at step 7; checkpoint md/checkpoint_7.mdl; rerun to resume"


def test_a_model_zoo_run_py_exits_143_on_sigterm_with_the_step_saved(project, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SIGNAL_AT", "4")
    monkeypatch.setenv("SEND_SIGNAL", "SIGTERM")
    md = tmp_path / "md"
    with pytest.raises(SystemExit) as end:
        cstorch.run(argv=["CPU", "--mode", "train", "--params", str(project), "--model_dir", str(md),
                          "--runner", "signalling:CpuRunner", "--max_steps", "10"])
    assert end.value.code == 143
    assert "Error" not in capsys.readouterr().err
    assert sorted(p.name for p in md.glob("checkpoint_*")) == ["checkpoint_4.mdl"]
    assert "interrupted (SIGTERM) at step 4; checkpoint" in (md / "run.log").read_text()
