"""A user module named by the params (model.name, a data_fn, runconfig.runner) that fails while it is
imported is the user's error, not cs-run's: one ``Error:`` line naming the key, the file:line where
the import failed and the error; exit 2; no model_dir; no traceback unless CS_RUN_DEBUG asks for one."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from cs_run.frontends.cli import cli

GOOD_MODEL = '''import torch


def build(width: int = 3):
    return torch.nn.Sequential(torch.nn.Linear(width, 1))
'''

GOOD_DATA = '''import torch


def build(split, batch_size):
    data = torch.utils.data.TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
    return torch.utils.data.DataLoader(data, batch_size=batch_size)
'''

PARAMS = '''train_input:
  data_fn: "{data}:build"
  batch_size: 4
model:
  name: "{model}:build"
optimizer:
  optimizer_type: SGD
  learning_rate: 0.1
runconfig:
  max_steps: 2
  model_dir: md
'''

# (what goes wrong, the bad line, its message). The bad line is appended at the end of the module.
BREAKAGES = {
    "syntax": ("class Broken(object)", "SyntaxError: expected ':'"),
    "name at module level": ("scale = undefined_name * 2", "NameError: name 'undefined_name' is not defined"),
    "missing package": ("import no_such_package_xyz", "ModuleNotFoundError: No module named 'no_such_package_xyz'"),
    "raises at import": ("ratio = 1 / 0", "ZeroDivisionError: division by zero"),
    "import error": ("from torch import no_such_name",
                     f"ImportError: cannot import name 'no_such_name' from 'torch' ({torch.__file__})"),
}

_names = itertools.count()


def _project(tmp_path, *, model=GOOD_MODEL, data=GOOD_DATA):
    n = next(_names)
    names = {"model": f"user_model_{n}", "data": f"user_data_{n}"}
    (tmp_path / f"{names['model']}.py").write_text(model)
    (tmp_path / f"{names['data']}.py").write_text(data)
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS.format(**names))
    return params, names


def _broken(text: str, bad_line: str) -> tuple[str, int]:
    lines = text.rstrip("\n").splitlines() + [bad_line]
    return "\n".join(lines) + "\n", len(lines)


def _invoke(*args, env=None):
    result = CliRunner().invoke(cli, list(map(str, args)), env=env)
    return result


def _error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


@pytest.fixture(autouse=True)
def _restore_sys_path():
    saved = list(sys.path)
    yield
    sys.path[:] = saved


@pytest.mark.parametrize("what", list(BREAKAGES))
@pytest.mark.parametrize("which", ["model", "data"])
def test_a_user_module_that_fails_to_import_is_a_params_error_at_its_line(what, which, tmp_path):
    bad_line, message = BREAKAGES[what]
    text, line_no = _broken(GOOD_MODEL if which == "model" else GOOD_DATA, bad_line)
    params, names = _project(tmp_path, **{which: text})
    result = _invoke("train", "--params", params)
    assert result.exit_code == 2
    key, key_line = ("model.name", 5) if which == "model" else ("train_input.data_fn", 2)
    assert _error_line(result) == (f"Error: params: {key}: importing '{names[which]}' failed at "
                                   f"{tmp_path / names[which]}.py:{line_no}: {message} ({params}:{key_line})")
    assert not (tmp_path / "md").exists()


def test_the_failure_is_located_in_the_module_it_happened_in(tmp_path):
    # model.py imports a helper of the user's whose line 2 is badly indented: the helper's line is named.
    (tmp_path / "user_helper_a.py").write_text("x = 1\n    y = 2\n")
    params, names = _project(tmp_path, model="import user_helper_a\n" + GOOD_MODEL)
    result = _invoke("train", "--params", params)
    assert result.exit_code == 2
    assert _error_line(result) == (f"Error: params: model.name: importing '{names['model']}' failed at "
                                   f"{tmp_path / 'user_helper_a.py'}:2: IndentationError: unexpected indent "
                                   f"({params}:5)")


def test_a_runner_module_that_fails_to_import_names_the_flag(tmp_path):
    (tmp_path / "user_runner_a.py").write_text("import cs_run\n\n\nclass R(cs_run.runners.PyTorchBaseRunner)\n    pass\n")
    params, _ = _project(tmp_path)
    result = _invoke("train", "--params", params, "--runner", "user_runner_a:R")
    assert result.exit_code == 2
    assert _error_line(result) == (f"Error: params: runconfig.runner: importing 'user_runner_a' failed at "
                                   f"{tmp_path / 'user_runner_a.py'}:4: SyntaxError: expected ':' (set on the command line)")
    assert not (tmp_path / "md").exists()


def test_a_module_that_is_not_there_still_asks_for_the_path(tmp_path):
    params, names = _project(tmp_path)
    params.write_text(params.read_text().replace(f"{names['model']}:build", "not_a_module_anywhere:build"))
    result = _invoke("train", "--params", params)
    assert result.exit_code == 2
    assert _error_line(result) == ("Error: params: model.name: cannot import module 'not_a_module_anywhere' (No module "
                                   "named 'not_a_module_anywhere'); is it on PYTHONPATH (or --python_paths)? "
                                   f"({params}:5)")


def test_cs_run_debug_shows_the_users_error_behind_the_line(tmp_path):
    text, line_no = _broken(GOOD_MODEL, "class Broken(object)")
    params, names = _project(tmp_path, model=text)
    result = _invoke("train", "--params", params, env={"CS_RUN_DEBUG": "1"})
    assert result.exit_code == 2
    out = result.output
    assert f'File "{tmp_path / names["model"]}.py", line {line_no}' in out  # Python's own SyntaxError display
    assert "The above exception was the direct cause of the following exception" in out
    assert out.rstrip("\n").splitlines()[-1].startswith(f"Error: params: model.name: importing '{names['model']}'")


def test_a_syntax_error_in_a_script_cs_run_exec_runs_is_the_users(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "user_helper_b.py").write_text("def f(:\n    pass\n")
    (tmp_path / "script.py").write_text("import sys\nimport user_helper_b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = _invoke("exec", "script.py")
    assert result.exit_code == 1
    lines = result.output.rstrip("\n").splitlines()
    assert lines[0] == "Traceback (most recent call last; your code's frames only):"
    assert lines[-1] == f"Error: SyntaxError: invalid syntax (in your code at {tmp_path / 'user_helper_b.py'}:1)"
    assert "internal error" not in result.output and "cs_run" not in result.output  # none of cs-run's frames


def test_python_m_cs_run_compat_reports_a_script_syntax_error_as_the_users(tmp_path):
    (tmp_path / "script.py").write_text("x = (\n")
    result = subprocess.run([sys.executable, "-m", "cs_run.frontends.compat", "script.py"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 1
    assert result.stderr.rstrip("\n").splitlines()[-1] == "Error: SyntaxError: '(' was never closed (in your code at script.py:1)"
    assert "cs_run" not in result.stderr


def test_cs_run_exec_help_is_the_commands_own():
    result = _invoke("exec", "--help")
    assert result.exit_code == 0
    assert result.output.startswith("Usage: cli exec [OPTIONS] SCRIPT [ARGS]...")
    assert "ARGS after SCRIPT, --help included, are the script's own" in result.output
