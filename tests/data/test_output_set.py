"""``cs-run data preprocess`` replaces its output as one set: a kill -9 or a failure at any step leaves the
old set or the new one, whole; the next run removes what a killed one left.

The reference is what a reader of the documented layout sees (``OUT/train/*``, ``OUT/val/*``,
``OUT/tokenizer.json``, read through the paths a params file names): the old run's bytes, or the bytes
of the same run made without interruption. Kills are real SIGKILLs of a child process, at every call of
the filesystem functions the switch uses (before the first call, between every two, after the last).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cs_run.data.preprocessing import _output_set
from cs_run.data.preprocessing import text_to_hdf5 as preprocess
from cs_run.errors import DataError
from cs_run.frontends.cli import cli
from tests.examples.gpt2_helpers import write_corpus

pytest.importorskip("tokenizers")

OLD_ARGS = ["--max_seq_length", "16", "--vocab_size", "300", "--eval_fraction", "0.25"]

# Runs the new set (msl 8, vocab 280, no val: every name differs from the old set's) into argv[3]; argv[1]
# is the call before which it kills itself (-1: never). Prints how many calls the run made.
_KILLED_RUN = r"""
import os, signal, sys
from pathlib import Path
from cs_run.data.preprocessing import _output_set
from cs_run.data.preprocessing import text_to_hdf5 as preprocess

at, calls = int(sys.argv[1]), [0]

def counted(fn):
    def call(*args, **kwargs):
        if calls[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
        calls[0] += 1
        return fn(*args, **kwargs)
    return call

for name in ("rename", "replace", "symlink", "link", "unlink", "rmdir"):
    setattr(os, name, counted(getattr(os, name)))
_output_set._exchange = counted(_output_set._exchange)
preprocess.preprocess(sorted(Path(sys.argv[2]).glob("*.txt")), Path(sys.argv[3]), 8, vocab_size=280,
                      overwrite=True, progress=False)
print(calls[0])
"""


def _seen(out: Path) -> dict:
    """What a reader of OUT/train, OUT/val and OUT/tokenizer.json gets (shards by their samples)."""
    import h5py

    seen = {}
    for split in ("train", "val"):
        if (out / split).is_dir():
            for f in sorted((out / split).iterdir()):
                if f.suffix == ".h5":
                    with h5py.File(f) as h:
                        seen[f"{split}/{f.name}"] = h["data"][...].tobytes()
                else:
                    seen[f"{split}/{f.name}"] = f.read_bytes()
    if (out / "tokenizer.json").is_file():
        seen["tokenizer.json"] = (out / "tokenizer.json").read_bytes()
    return seen


def _leftovers(out: Path) -> list[str]:
    """Hidden entries besides the pointer and the one current set."""
    current = os.readlink(out / ".current") if (out / ".current").is_symlink() else None
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".") and p.name not in (".current", current))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def old_output(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("old") / "out"
    result = CliRunner().invoke(cli, ["data", "preprocess", str(corpus), "-o", str(out), *OLD_ARGS])
    assert result.exit_code == 0, result.output
    return out


def _place_old(old_output: Path, out: Path, layout: str) -> None:
    """The old output as this cs-run writes it (links and sets), or as cs-run wrote it before (real
    train/, val/, tokenizer.json)."""
    if layout == "sets":
        shutil.copytree(old_output, out, symlinks=True)
        return
    out.mkdir()
    for name in ("train", "val"):
        shutil.copytree(old_output / name, out / name)
    shutil.copyfile(old_output / "tokenizer.json", out / "tokenizer.json")


def _new_set(corpus: Path, out: Path) -> None:
    """The run _KILLED_RUN makes, in this process."""
    preprocess.preprocess(sorted(corpus.glob("*.txt")), out, 8, vocab_size=280, overwrite=True, progress=False)


def _run(at: int, corpus: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _KILLED_RUN, str(at), str(corpus), str(out)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("layout", ["sets", pytest.param("legacy", marks=pytest.mark.slow)])  # legacy: 14 s
def test_a_kill_at_every_step_leaves_the_old_or_the_new_output_whole(tmp_path, corpus, old_output, layout):
    old = _seen(old_output)
    reference = tmp_path / "reference"
    _place_old(old_output, reference, layout)
    done = _run(-1, corpus, reference)
    assert done.returncode == 0, done.stderr
    new, total = _seen(reference), int(done.stdout.split()[-1])
    assert new != old and "val/examples_0.h5" not in new and total >= 4
    outcomes = []
    for at in range(total):
        out = tmp_path / f"out{at}"
        _place_old(old_output, out, layout)
        killed = _run(at, corpus, out)
        assert killed.returncode == -signal.SIGKILL, (at, killed.stderr)
        seen = _seen(out)
        assert seen in (old, new), f"killed before call {at}: neither the old output nor the new one"
        outcomes.append("old" if seen == old else "new")
        _new_set(corpus, out)  # the next run: the whole new output, nothing of the killed one left
        assert _seen(out) == new and _leftovers(out) == [], (at, _leftovers(out))
        shutil.rmtree(out)
    assert outcomes[0] == "old" and outcomes[-1] == "new" and outcomes == sorted(outcomes, key="new".__eq__)


@pytest.mark.parametrize("layout", ["sets", "legacy"])
def test_a_failure_at_every_step_before_the_switch_keeps_the_old_output(tmp_path, corpus, old_output, monkeypatch,
                                                                         layout):
    """Any filesystem call of the switch failing (a full disk) is one DataError and the old output as it
    was, up to the pointer's rename; after it the new output stands (cleanup failures only warn)."""
    old, docs = _seen(old_output), sorted(corpus.glob("*.txt"))
    results = []
    for fail_at in range(60):
        out = tmp_path / f"out{fail_at}"
        _place_old(old_output, out, layout)
        calls = []

        def failing(fn, fail_at=fail_at, calls=calls):
            def call(*args, **kwargs):
                calls.append(fn.__name__)
                if len(calls) == fail_at + 1:
                    raise OSError(28, "No space left on device")
                return fn(*args, **kwargs)
            return call

        with monkeypatch.context() as m:
            for name in ("rename", "replace", "symlink", "link"):
                m.setattr(os, name, failing(getattr(os, name)))
            try:
                preprocess.preprocess(docs, out, 8, vocab_size=280, overwrite=True, progress=False)
                results.append("new")
            except DataError as e:
                assert f"writing the output into {out} failed (" in str(e) and "nothing in it was changed" in str(e)
                assert _seen(out) == old and not list(out.glob(".preprocess-*")), fail_at
                results.append("old")
        if len(calls) <= fail_at:  # no call failed: every step has been tried
            break
    assert results == ["old"] * (len(results) - 1) + ["new"] and len(results) >= 3


def test_the_next_run_removes_what_killed_runs_left(tmp_path, corpus, old_output):
    out = tmp_path / "out"
    _place_old(old_output, out, "sets")
    stale = [out / ".preprocess-killed", out / ".set-killed", out / ".link-train-1"]
    stale[0].mkdir()
    (stale[0] / "examples_0.h5").write_bytes(b"half")
    shutil.copytree((out / "train").resolve(), stale[1] / "train")
    (out / ".link-train-1").symlink_to(".current/train")
    result = CliRunner().invoke(cli, ["data", "preprocess", str(corpus), "-o", str(out), *OLD_ARGS, "--overwrite"])
    assert result.exit_code == 0, result.output
    assert _leftovers(out) == [] and not any(os.path.lexists(p) for p in stale)
    assert _seen(out) == _seen(old_output)  # the same run again: the same output


def test_a_folder_a_live_run_holds_is_left_alone(tmp_path, old_output):
    """A staging folder is locked by its run: another run's cleanup removes only the unlocked ones."""
    out = tmp_path / "out"
    _place_old(old_output, out, "sets")
    live = _output_set.Staging(out)
    try:
        dead = out / ".preprocess-dead"
        dead.mkdir()
        _output_set.clean_stale(out)
        assert live.path.is_dir() and not dead.exists()
    finally:
        live.close()
    assert not live.path.exists()


def test_overwrite_removes_the_old_sets_files(tmp_path, corpus, old_output):
    """A run without val over one with val: OUT/val goes with the old set (new train never sits beside an
    old val of another tokenizer); the old set's folder is removed."""
    out = tmp_path / "out"
    _place_old(old_output, out, "sets")
    old_set = os.readlink(out / ".current")
    result = CliRunner().invoke(cli, ["data", "preprocess", str(corpus), "-o", str(out), "--max_seq_length", "8",
                                      "--vocab_size", "280", "--overwrite"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["tokenizer.json", "train"]
    assert not (out / old_set).exists() and _leftovers(out) == []
    assert (out / "tokenizer.json").read_bytes() != (old_output / "tokenizer.json").read_bytes()


def test_given_tokenizer_is_copied_into_the_set(tmp_path, corpus, old_output):
    """With --tokenizer, OUT/tokenizer.json is that tokenizer (the shards' own), not an older one left beside."""
    out = tmp_path / "out"
    _place_old(old_output, out, "sets")
    other = tmp_path / "other"
    assert CliRunner().invoke(cli, ["data", "preprocess", str(corpus), "-o", str(other), "--max_seq_length", "8",
                                    "--vocab_size", "280"]).exit_code == 0
    given = other / "tokenizer.json"
    refused = CliRunner().invoke(cli, ["data", "preprocess", str(corpus), "-o", str(out), "--tokenizer", str(given)])
    assert refused.exit_code == 2 and "already holds *.h5 shards" in refused.output
    result = CliRunner().invoke(cli, ["data", "preprocess", str(corpus), "-o", str(out), "--max_seq_length", "8",
                                      "--tokenizer", str(given), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert (out / "tokenizer.json").read_bytes() == given.read_bytes()
    assert _seen(out) == _seen(other)  # same documents, same tokenizer, same msl: the same set
