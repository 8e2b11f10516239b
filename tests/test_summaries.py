"""ScalarWriter: CSV always (append on resume), TensorBoard event files when tensorboard is present."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
import torch

from cs_run.summaries import CSV_NAME, RUN_ID, ScalarRow, ScalarWriter, read_scalar_rows, read_scalars


def test_csv_rows_and_read_back(tmp_path):
    with ScalarWriter(tmp_path / "train", tensorboard=False) as w:
        w.add_scalar("loss", torch.tensor(2.5), 1)
        w.add_scalars({"loss": 1.25, "lr": torch.tensor([0.5])}, 2)
        assert not w.writes_tensorboard
    with open(tmp_path / "train" / CSV_NAME) as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "tag", "value", "wall_time", "run"]
    assert [r[:3] for r in rows[1:]] == [
        ["1", "loss", "2.5"],
        ["2", "loss", "1.25"],
        ["2", "lr", "0.5"],
    ]
    assert all(float(r[3]) > 0 for r in rows[1:])
    assert {r[4] for r in rows[1:]} == {RUN_ID}
    assert read_scalars(tmp_path / "train") == {
        "loss": [(1, 2.5), (2, 1.25)],
        "lr": [(2, 0.5)],
    }


def test_resumed_run_appends_and_later_value_of_a_step_wins(tmp_path):
    with ScalarWriter(tmp_path, tensorboard=False) as w:
        w.add_scalar("loss", 3.0, 1)
        w.add_scalar("loss", 2.0, 2)
    with ScalarWriter(tmp_path, tensorboard=False) as w:
        w.add_scalar("loss", 1.5, 2)
        w.add_scalar("loss", 1.0, 3)
    rows = (tmp_path / CSV_NAME).read_text().splitlines()
    assert sum(r.startswith("step,") for r in rows) == 1
    assert read_scalars(tmp_path) == {"loss": [(1, 3.0), (2, 1.5), (3, 1.0)]}


def test_rows_in_written_order_with_their_run(tmp_path, monkeypatch):
    # Two invocations appending to one file (a restart from an earlier step): every row, in order.
    monkeypatch.setattr("cs_run.summaries.RUN_ID", "first")
    with ScalarWriter(tmp_path, tensorboard=False) as w:
        w.add_scalar("loss", 3.0, 1, wall_time=10.0)
        w.add_scalar("loss", 2.0, 2, wall_time=11.0)
    monkeypatch.setattr("cs_run.summaries.RUN_ID", "second")
    with ScalarWriter(tmp_path, tensorboard=False) as w:
        w.add_scalar("loss", 2.5, 2, wall_time=20.0)
    assert read_scalar_rows(tmp_path) == [
        ScalarRow(1, "loss", 3.0, 10.0, "first"),
        ScalarRow(2, "loss", 2.0, 11.0, "first"),
        ScalarRow(2, "loss", 2.5, 20.0, "second"),
    ]


def test_four_column_file_of_an_older_version_keeps_its_layout(tmp_path):
    (tmp_path / CSV_NAME).write_text("step,tag,value,wall_time\n1,loss,3.0,10.000\n")
    with ScalarWriter(tmp_path, tensorboard=False) as w:
        w.add_scalar("loss", 2.0, 2, wall_time=11.0)
    with open(tmp_path / CSV_NAME) as f:
        assert [len(r) for r in csv.reader(f)] == [4, 4, 4]
    assert read_scalar_rows(tmp_path) == [ScalarRow(1, "loss", 3.0, 10.0, ""), ScalarRow(2, "loss", 2.0, 11.0, "")]


def test_tensorboard_event_files_match_csv(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with ScalarWriter(tmp_path) as w:
        assert w.writes_tensorboard
        for step in range(1, 4):
            w.add_scalar("loss", 1.0 / step, step)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    events = [(e.step, e.value) for e in acc.Scalars("loss")]
    want = read_scalars(tmp_path)["loss"]
    assert [s for s, _ in events] == [s for s, _ in want]
    assert [v for _, v in events] == pytest.approx(
        [v for _, v in want], rel=1e-7
    )  # float32


def test_bad_values_and_closed_writer(tmp_path):
    w = ScalarWriter(tmp_path, tensorboard=False)
    with pytest.raises(TypeError, match="'loss'"):
        w.add_scalar("loss", "high", 1)
    with pytest.raises((TypeError, RuntimeError)):
        w.add_scalar("loss", torch.ones(3), 1)
    w.close()
    w.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        w.add_scalar("loss", 1.0, 1)
    assert read_scalars(tmp_path / "missing") == {}


_FAILING_EVENT_FILE = r"""
import sys
from tensorboard.summary.writer import record_writer
from cs_run.summaries import ScalarWriter

writer = ScalarWriter(sys.argv[1], tensorboard=True)
def refuse(self, data):  # what a model_dir made read-only mid-run gives the event-file thread
    raise PermissionError(13, "Permission denied")
record_writer.RecordWriter.write = refuse
writer.add_scalar("loss", 1.0, 1)
try:
    writer.flush()
    writer.add_scalar("loss", 1.0, 2)
    writer.flush()
except PermissionError as e:
    print("the run got:", e)
"""


def test_a_failed_event_file_write_reaches_the_run_once_without_a_thread_traceback(tmp_path):
    """tensorboard's writer thread re-raises its error after keeping it for the run: without cs-run's hook
    its traceback ("Exception in thread") came before the run's Error line."""
    pytest.importorskip("tensorboard")
    done = subprocess.run([sys.executable, "-c", _FAILING_EVENT_FILE, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "the run got: [Errno 13] Permission denied" in done.stdout
    assert "Traceback" not in done.stderr and "Exception in thread" not in done.stderr, done.stderr
