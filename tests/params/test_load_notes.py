"""A params load's notes (a data_dir found next to the params file, a Model Zoo key with no effect) belong
to that load: the runs of its params log them in their run.log, no run of another load does (before, the
notes were one list per process, flushed by whichever run opened its log next)."""

from __future__ import annotations

import logging

import yaml

from cs_run import _logging
from cs_run.params import load_params, params_from_dict
from cs_run.runners import PyTorchBaseRunner

SAVE_LOSSES = "params: runconfig.save_losses = True is a Model Zoo key recorded with no effect here"
DEBUG_METRICS = "params: runconfig.show_debug_metrics = False is a Model Zoo key recorded with no effect here"
FALLBACK = "is not in the working directory; using"


def _variant(toy_project, name, **runconfig):
    raw = yaml.safe_load(toy_project.read_text())
    raw["runconfig"].update(runconfig)
    path = toy_project.parent / name
    path.write_text(yaml.safe_dump(raw))
    return path


def _run(params, model_dir):
    params.runconfig.model_dir = str(model_dir)
    PyTorchBaseRunner.create(params, device="CPU", mode="train").run("train")
    return (model_dir / "run.log").read_text()


def test_each_run_logs_the_notes_of_its_own_load_only(toy_project, tmp_path, monkeypatch):
    (tmp_path / "data_a").mkdir()  # next to the params files, not in the working folder
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    a = load_params(_variant(toy_project, "a.yaml", save_losses=True),
                    {"runconfig.max_steps": 2})
    raw = yaml.safe_load(toy_project.read_text())
    raw["train_input"]["data_dir"] = "data_a"
    raw["runconfig"].update(max_steps=2, show_debug_metrics=False, save_losses=True)
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(raw))
    b = load_params(tmp_path / "b.yaml")
    c = load_params(toy_project, {"runconfig.max_steps": 2})  # a load with nothing to note
    assert [m for _, m in a.notes] == [SAVE_LOSSES + " (losses are always written to model_dir's summaries)"]
    assert len(b.notes) == 3 and not c.notes

    log_c = _run(c, tmp_path / "md_c")  # the last load runs first: nothing of a's or b's
    log_b = _run(b, tmp_path / "md_b")
    log_a = _run(a, tmp_path / "md_a")  # the same key as b's: noted again, for this run too
    assert SAVE_LOSSES not in log_c and FALLBACK not in log_c and DEBUG_METRICS not in log_c
    assert SAVE_LOSSES in log_b and DEBUG_METRICS in log_b
    assert f"train_input.data_dir 'data_a' {FALLBACK} {tmp_path / 'data_a'}" in log_b
    assert log_a.count(SAVE_LOSSES) == 1 and DEBUG_METRICS not in log_a and FALLBACK not in log_a
    assert _run(load_params(toy_project, {"runconfig.max_steps": 2}), tmp_path / "md_d").count("Model Zoo key") == 0


def test_params_from_a_dict_keep_their_notes_too():
    raw = yaml.safe_load(_TOY)
    raw["runconfig"]["show_debug_metrics"] = True
    params = params_from_dict(raw)
    assert [m for _, m in params.notes] == [
        "params: runconfig.show_debug_metrics = True is a Model Zoo key recorded with no effect here "
        "(vendor appliance debug metrics)"]
    assert not params_from_dict(yaml.safe_load(_TOY)).notes


def test_a_note_outside_any_load_is_logged_at_once(caplog):
    with caplog.at_level(logging.INFO, logger="cs_run"):
        _logging.defer("cs_run.params", "a note with no load")
        with _logging.collecting_notes() as notes:
            _logging.defer("cs_run.params", "a load's note")
            _logging.defer("cs_run.params", "a load's note")  # once per load
    assert caplog.messages == ["a note with no load"]
    assert notes == [("cs_run.params", "a load's note")]


_TOY = """
model: {name: "toy_models:build_model"}
optimizer: {optimizer_type: SGD, learning_rate: 0.1}
runconfig: {max_steps: 2}
"""
