"""Packaging tells the truth: the Python and torch versions setup.cfg and ruff state are the ones the code needs."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from cs_run._version_check import SUPPORTED_TORCH, UnsupportedTorchError, check_torch_version, torch_requirement

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version", ["2.11.0", "2.11.0+cu130", "2.12.1+cpu", "2.13.0", "2.13.0a0+git1234",
                                     "2.14.1", "2.14.0+cu126", "2.15.0", "2.15.0+cu132"])
def test_torch_in_the_range_is_accepted(version):
    check_torch_version(version)


@pytest.mark.parametrize("version", ["2.4.0", "2.10.2+cpu", "2.16.0", "2.16.0a0+git1234", "3.12.0", "1.13.1", "nightly"])
def test_other_torch_versions_fail_with_one_line(version):
    with pytest.raises(ImportError, match=rf"cs-run needs torch 2\.11 to 2\.15 .* found torch {re.escape(version)}; "
                                          r"install one with pip install 'torch>=2\.11,<2\.16'") as info:
        check_torch_version(version)
    assert isinstance(info.value, UnsupportedTorchError) and "\n" not in str(info.value)


@pytest.mark.parametrize("entry", [
    "import cs_run",
    "sys.argv = ['cs-run', '--help']; from cs_run.frontends.cli import main; main()",  # what the console script runs
    "sys.argv = ['cs-run', 'train', '--help']; from cs_run.frontends.cli import main; main()",
])
def test_import_and_help_refuse_another_torch_in_one_line_and_the_escape_hatch_works(entry):
    code = f"import sys, torch; torch.__version__ = '2.10.0'\n{entry}"
    refused = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert refused.returncode == 1 and refused.stdout == "", refused
    assert refused.stderr.splitlines() == [
        "Error: cs-run needs torch 2.11 to 2.15 (its CSX engine uses torch internals that change between releases) "
        "but found torch 2.10.0; install one with pip install 'torch>=2.11,<2.16', or set CS_RUN_ANY_TORCH=1 to "
        "try anyway"], refused.stderr
    allowed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                             env={**os.environ, "CS_RUN_ANY_TORCH": "1"})
    assert allowed.returncode == 0 and "Traceback" not in allowed.stderr, allowed.stderr


def test_a_caught_refusal_leaves_other_errors_their_traceback():
    """The one-line hook knows only the refusal: after a caught one, another uncaught error still shows its traceback."""
    code = ("import sys, torch; torch.__version__ = '2.10.0'\ntry:\n    import cs_run\nexcept ImportError:\n    pass\n"
            "raise ValueError('another error')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 1 and "Traceback" in result.stderr and "ValueError: another error" in result.stderr


def test_declared_versions_match_the_code():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["options"]["python_requires"].strip() == ">=3.11"  # typing.Self, tomllib, ...
    assert torch_requirement() == "torch>=2.11,<2.16" and torch_requirement() in cfg["options"]["install_requires"].split()
    assert SUPPORTED_TORCH[0] <= tuple(int(x) for x in torch.__version__.split(".")[:2]) <= SUPPORTED_TORCH[1]
    ruff = tomllib.loads((ROOT / "ruff.toml").read_text())
    assert ruff["target-version"] == "py311"


def _extras() -> dict[str, list[str]]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return {name: value.split() for name, value in cfg["options.extras_require"].items()}


def test_the_license_file_is_the_license_setup_cfg_names():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["metadata"]["license"] == "Apache-2.0" and cfg["metadata"]["license_files"].strip() == "LICENSE"
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"] and "END OF TERMS AND CONDITIONS" in text


def test_every_optional_package_names_the_extra_that_installs_it():
    from cs_run.exits import OPTIONAL_PACKAGES

    extras = _extras()
    for module, (package, extra) in OPTIONAL_PACKAGES.items():
        assert package in extras[extra], (module, package, extra)
    ruff = tomllib.loads((ROOT / "ruff.toml").read_text())
    banned = {name.split(".")[0] for name in ruff["lint"]["flake8-tidy-imports"]["banned-module-level-imports"]}
    assert banned - {"h5py", "torch", "triton"} <= set(OPTIONAL_PACKAGES)  # every lazily imported extra


def _run_without(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """cs-run with ``module`` missing (None in sys.modules makes its import fail as if not installed)."""
    code = f"import sys; sys.modules[{module!r}] = None\nfrom cs_run.frontends.cli import main\nmain()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("module, extra, args", [
    ("sklearn", "examples", ["train", "--model_dir", "md", "--max_steps", "1"]),  # the bundled digits
    ("matplotlib", "plot", ["plot", "{md}"]),
    ("safetensors", "safetensors", ["checkpoint", "convert", "{ckpt}", "w.safetensors"]),
    ("tokenizers", "text", ["data", "preprocess", "--stdlib", "-o", "shards"]),
    ("lm_eval", "eval", ["lm-eval", "--params", "p.yaml", "--checkpoint_path", "{ckpt}", "--tasks", "t"]),
])
def test_a_missing_optional_package_is_one_error_line_naming_its_extra(module, extra, args, tmp_path):
    import cs_run

    md = tmp_path / "run"
    (md / "train").mkdir(parents=True)
    (md / "train" / "scalars.csv").write_text("step,tag,value\n1,loss,0.5\n2,loss,0.4\n")
    cs_run.save({"w": torch.ones(2)}, str(tmp_path / "c.mdl"))
    args = [a.replace("{md}", str(md)).replace("{ckpt}", str(tmp_path / "c.mdl")) for a in args]
    result = _run_without(module, *args, cwd=tmp_path)
    lines = [line for line in result.stderr.splitlines() if line.strip() and " INFO: " not in line]
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ") and f"pip install 'cs-run[{extra}]'" in lines[0], lines[0]


def test_a_missing_optional_package_elsewhere_is_mapped_by_the_exit_handler():
    from cs_run.exits import error_text

    error = ModuleNotFoundError("No module named 'matplotlib.pyplot'", name="matplotlib.pyplot")
    assert error_text(error) == ("Error: matplotlib is not installed; install the 'plot' extra: "
                                 "pip install 'cs-run[plot]'")


def test_import_cs_run_and_help_do_not_import_torch():
    """What keeps `import cs_run` and `cs-run --help` fast (bench/bench_import.py times them)."""
    code = ("import sys\nimport cs_run\nassert 'torch' not in sys.modules, 'import cs_run'\n"
            "from cs_run.frontends.cli import cli\nfrom click.testing import CliRunner\n"
            "for args in (['--help'], ['train', '--help'], ['eval', '--num_epochs', '3']):\n"
            "    CliRunner().invoke(cli, args)\n"
            "assert 'torch' not in sys.modules, 'help'\n"
            "cs_run.backend\nassert 'torch' in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
