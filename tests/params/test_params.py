"""Params files: every bad input names the key (and line), valid ones fill defaults and resolve paths."""

from __future__ import annotations

import pytest
import yaml

from cs_run.errors import ParamsError
from cs_run.params import ModelParams, Params, RunConfig, load_params, parse_override, save_params
from cs_run.resolve import resolve_params

GOOD = {
    "train_input": {"data_dir": "data/train", "batch_size": 32},
    "model": {"name": "fc_mnist", "depth": 2, "hidden_size": 16},
    "optimizer": {"optimizer_type": "SGD", "learning_rate": 0.1, "momentum": 0.9},
    "runconfig": {"max_steps": 10, "log_steps": 5},
}


def write(tmp_path, data, name="params.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def load(path, overrides=None):
    """Both steps, as every entry point runs them: parse and validate, then resolve."""
    params = load_params(path, overrides)
    resolve_params(params)
    return params


def test_valid_file_fills_defaults_and_resolves_relative_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    params = load(write(tmp_path / "configs", GOOD))
    assert params.runconfig.max_steps == 10
    assert params.runconfig.checkpoint_steps == 0  # default
    assert params.train_input.batch_size == 32 and params.train_input.shuffle is True
    # the vendor's rule: relative data paths are relative to the working directory, not the file's folder
    assert params.train_input.data_dir == str((tmp_path / "data/train").resolve())
    assert params.model.extra == {"depth": 2, "hidden_size": 16}
    assert params.optimizer.extra == {"momentum": 0.9}
    assert isinstance(params.optimizer.learning_rate, float)


def test_unknown_key_names_path_closest_key_and_line(tmp_path):
    data = {**GOOD, "runconfig": {"max_stesp": 10, "log_steps": 5}}
    path = write(tmp_path, data)
    with pytest.raises(ParamsError) as err:
        load(path)
    msg = str(err.value)
    assert "runconfig.max_stesp" in msg and "did you mean 'max_steps'" in msg
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "max_stesp" in text)
    assert f"{path}:{line}" in msg
    assert err.value.exit_code == 2


def test_unknown_section(tmp_path):
    with pytest.raises(ParamsError, match=r"unknown key runconfg; did you mean 'runconfig'"):
        load(write(tmp_path, {**GOOD, "runconfg": {}}))


@pytest.mark.parametrize("key, value, expected", [
    ("runconfig.log_steps", "ten", r"runconfig.log_steps: expected an integer, got str 'ten'"),
    ("runconfig.log_steps", 0, r"runconfig.log_steps: must be >= 1, got 0"),
    ("runconfig.seed", 1.5, r"runconfig.seed: expected an integer, got float 1.5"),
    ("train_input.shuffle", "yes", r"train_input.shuffle: expected a boolean"),
    ("train_input.batch_size", -4, r"train_input.batch_size: must be >= 1, got -4"),
    ("optimizer.max_gradient_norm", 0, r"optimizer.max_gradient_norm: must be > 0, got 0"),
    ("optimizer.learning_rate", -0.5, r"optimizer.learning_rate: must be >= 0, got -0.5"),  # the vendor's optimizers refuse it
    ("runconfig.logging", "LOUD", r"runconfig.logging: 'LOUD' is not one of DEBUG, INFO"),
    ("model.depth", "two", r"model.depth: expected an integer, got str 'two'"),
])
def test_wrong_type_or_range_names_key_value_and_expectation(tmp_path, key, value, expected):
    section, name = key.split(".")
    data = {k: dict(v) for k, v in GOOD.items()}
    data[section][name] = value
    with pytest.raises(ParamsError, match=expected):
        load(write(tmp_path, data))


def test_model_keys_are_checked_against_the_model_function(tmp_path):
    data = {**GOOD, "model": {"name": "fc_mnist", "hiden_size": 3}}
    with pytest.raises(ParamsError, match=r"unknown key model.hiden_size; did you mean 'hidden_size'"):
        load(write(tmp_path, data))


def test_unknown_model_name_lists_registered_models(tmp_path):
    data = {**GOOD, "model": {"name": "fc_mnsit"}}
    with pytest.raises(ParamsError, match=r"model.name: unknown model 'fc_mnsit'; registered models: (.*, )?fc_mnist,"):
        load(write(tmp_path, data))


@pytest.mark.parametrize("section, key", [("model", "name"), ("optimizer", "optimizer_type"),
                                          ("optimizer", "learning_rate")])
def test_missing_required_key(tmp_path, section, key):
    data = {k: dict(v) for k, v in GOOD.items()}
    del data[section][key]
    with pytest.raises(ParamsError, match=rf"missing required key {section}.{key}"):
        load(write(tmp_path, data))


def test_missing_model_section(tmp_path):
    data = {k: v for k, v in GOOD.items() if k != "model"}
    with pytest.raises(ParamsError, match="missing required section 'model'"):
        load(write(tmp_path, data))


@pytest.mark.parametrize("runconfig, expected", [
    ({"num_steps": 5, "num_epochs": 1}, "mutually exclusive"),
    ({"steps_per_epoch": 5}, "runconfig.steps_per_epoch only sets the length of an epoch"),
])
def test_conflicting_step_keys(tmp_path, runconfig, expected):
    with pytest.raises(ParamsError, match=expected):
        load(write(tmp_path, {**GOOD, "runconfig": runconfig}))


def test_clip_by_norm_and_value_conflict(tmp_path):
    opt = {**GOOD["optimizer"], "max_gradient_norm": 1.0, "max_gradient_value": 1.0}
    with pytest.raises(ParamsError, match="max_gradient_norm and optimizer.max_gradient_value are mutually"):
        load(write(tmp_path, {**GOOD, "optimizer": opt}))


def test_missing_file_directory_and_bad_yaml(tmp_path):
    with pytest.raises(ParamsError, match="params file not found"):
        load(tmp_path / "nope.yaml")
    with pytest.raises(ParamsError, match="is a folder"):
        load(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  name: [unclosed\n")
    with pytest.raises(ParamsError, match=rf"not valid YAML \({bad}:\d+\)"):
        load(bad)


def test_overrides_apply_after_reading_and_are_located_on_the_command_line(tmp_path):
    path = write(tmp_path, GOOD)
    params = load(path, dict([parse_override("runconfig.log_steps=7"), parse_override("model.depth=3")]))
    assert params.runconfig.log_steps == 7 and params.model.extra["depth"] == 3
    with pytest.raises(ParamsError, match=r"runconfig.log_steps: expected an integer.*set on the command line"):
        load(path, dict([parse_override("runconfig.log_steps=abc")]))
    with pytest.raises(ParamsError, match="--set expects KEY=VALUE"):
        parse_override("runconfig.log_steps")
    removed = load(path, dict([parse_override("optimizer.momentum=null"), parse_override("runconfig.log_steps=")]))
    assert "momentum" not in removed.optimizer.extra and removed.runconfig.log_steps == 100  # the default


def test_resolved_params_round_trip(tmp_path):
    params = load(write(tmp_path, GOOD))
    out = save_params(params, tmp_path / "model_dir")
    again = load(out)
    assert again.to_dict() == params.to_dict()


@pytest.mark.parametrize("key", ["python_paths", "mount_dirs"])
def test_folders_of_the_csx_flags_must_exist(tmp_path, key):
    ok = load(write(tmp_path, {**GOOD, "runconfig": {"max_steps": 1, key: ["."]}}))
    assert getattr(ok.runconfig, key) == [str(tmp_path)]  # relative to the params file's folder
    with pytest.raises(ParamsError, match=rf"runconfig.{key}: '.*missing' is not an existing folder"):
        load(write(tmp_path, {**GOOD, "runconfig": {"max_steps": 1, key: ["missing"]}}))


def test_data_dir_falls_back_to_the_params_folder_and_says_so(tmp_path, monkeypatch):
    (tmp_path / "configs" / "data" / "train").mkdir(parents=True)
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")  # data/train exists only next to the params file
    params = load(write(tmp_path / "configs", GOOD))
    assert params.train_input.data_dir == str((tmp_path / "configs" / "data" / "train").resolve())
    assert any("relative to the params file" in m for _, m in params.notes)  # logged when its run starts
    (tmp_path / "run" / "data" / "train").mkdir(parents=True)  # once both exist, the working directory wins
    assert load(write(tmp_path / "configs", GOOD)).train_input.data_dir == str(tmp_path / "run" / "data" / "train")


def test_params_with_names_reword_a_message_as_the_user_wrote_it():
    # The Trainer's params: no file; what it calls each key path (Params.names) and its head replace the params
    # file's words, in cs-run's messages and in a data function's own; a file path is left as it is.
    params = Params(model=ModelParams(name="m"), optimizer=None, runconfig=RunConfig(),
                    names={"train_input": "train_dataloader", "runconfig.num_steps": "loop.num_steps"},
                    head="Trainer: ")
    message = ("params: train_input.data_dir: nothing in /data/train_input.x/train_input (train_input, "
               "runconfig.num_steps, runconfig.num_stepsx, eval_input.data_dir)")
    assert params.named(message) == ("Trainer: train_dataloader.data_dir: nothing in /data/train_input.x/train_input "
                                     "(train_dataloader, loop.num_steps, runconfig.num_stepsx, eval_input.data_dir)")
    err = params.locate_error(ParamsError(message))
    assert isinstance(err, ParamsError) and str(err) == params.named(message)
    unnamed = Params(model=ModelParams(name="m"), optimizer=None, runconfig=RunConfig())
    assert unnamed.named(message) == message and str(unnamed.locate_error(ParamsError(message))) == message


@pytest.mark.parametrize("text, value", [("1e-05", 1e-05), ("1E-5", 1e-05), ("-2e3", -2000.0), ("+1e+2", 100.0),
                                         ("1.5e-3", 1.5e-3), ("'1e-05'", "1e-05"), ("1e", "1e"), ("e5", "e5")])
def test_an_exponent_without_a_dot_is_a_float_as_in_yaml_1_2(text, value):
    # PyYAML (YAML 1.1) reads 1e-05 as a string; the Model Zoo's pydantic configs coerce it to their float
    # fields, and its files carry it (Release 2.10 gptj TRC2: layer_norm_epsilon: 1e-05). Quoted stays text.
    from cs_run import _yaml

    data, _ = _yaml.parse(f"model:\n  layer_norm_epsilon: {text}\n", "params.yaml")
    assert data["model"]["layer_norm_epsilon"] == value
    assert type(data["model"]["layer_norm_epsilon"]) is type(value)


_TWICE = """train_input:
  data_dir: data/train
  batch_size: 32
model:
  name: fc_mnist
  depth: 2
  hidden_size: 16
optimizer:
  optimizer_type: SGD
  learning_rate: 0.1
  momentum: 0.9
runconfig:
  max_steps: 10
"""


@pytest.mark.parametrize("text, key, value, note", [
    # Cerebras-GPT 256m_mup.yaml of Releases 2.0-2.3: one initializer key twice, with one value.
    (_TWICE.replace("  depth: 2\n", "  depth: 2\n  depth: 2\n"), "model.depth", 2,
     "params: model.depth is given twice with the same value ({f}:6 and {f}:7)"),
    # Release 2.4's gemma2 27b file: trainer.init.callbacks twice with two lists; the vendor keeps the last.
    (_TWICE.replace("  momentum: 0.9\n", "  momentum: 0.9\n  momentum: 0.5\n"), "optimizer.momentum", 0.5,
     "params: optimizer.momentum is given twice ({f}:11 and {f}:12); the last one is used, as the Model Zoo's YAML "
     "loader does: delete the one you do not mean"),
    (_TWICE + "runconfig:\n  max_steps: 3\n", "runconfig.max_steps", 3,
     "params: runconfig is given twice ({f}:12 and {f}:14); the last one is used"),
])
def test_a_key_given_twice_keeps_the_last_as_the_vendors_loader_and_notes_it(tmp_path, text, key, value, note):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    params = load(path)
    section, name = key.split(".")
    assert params.to_dict()[section][name] == value == yaml.safe_load(text)[section][name]  # PyYAML's value
    noted = [message for _, message in params.notes]
    assert any(m.startswith(note.format(f=path)) for m in noted), noted


def test_a_key_given_twice_is_located_at_its_last_line(tmp_path):
    """Messages name the line of the value in use; the first value's nested keys are forgotten."""
    path = tmp_path / "params.yaml"
    path.write_text(_TWICE.replace("runconfig:\n  max_steps: 10\n", "runconfig:\n  max_steps: 10\n  log_steps: 5\n"
                                   "runconfig:\n  max_steps: -1\n"))
    with pytest.raises(ParamsError, match=rf"runconfig.max_steps.*\({path}:16\)"):
        load(path)
    path.write_text(_TWICE.replace("runconfig:\n  max_steps: 10\n", "runconfig:\n  log_stepz: 5\n"
                                   "runconfig:\n  max_steps: 10\n"))
    assert load(path).runconfig.max_steps == 10  # the misspelled key went with the first section
