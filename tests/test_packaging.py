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

from cs_run._version_check import SUPPORTED_TORCH, check_torch_version

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version", ["2.13.0", "2.13.1+cpu", "2.13.0a0+git1234", "2.13.2+cu126"])
def test_torch_213_is_accepted(version):
    check_torch_version(version)


@pytest.mark.parametrize("version", ["2.4.0", "2.12.1+cpu", "2.14.0", "3.13.0", "1.13.1", "nightly"])
def test_other_torch_versions_fail_with_one_line(version):
    with pytest.raises(ImportError, match=rf"cs-run needs torch 2\.13\.x .* found torch {re.escape(version)}") as info:
        check_torch_version(version)
    assert "\n" not in str(info.value)


def test_import_refuses_another_torch_and_the_escape_hatch_works():
    code = "import torch; torch.__version__ = '2.4.0'; import cs_run"
    refused = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert refused.returncode != 0 and "cs-run needs torch 2.13.x" in refused.stderr
    allowed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                             env={**os.environ, "CS_RUN_ANY_TORCH": "1"})
    assert allowed.returncode == 0, allowed.stderr


def test_declared_versions_match_the_code():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["options"]["python_requires"].strip() == ">=3.11"  # typing.Self, tomllib, ...
    assert "torch>=2.13,<2.14" in cfg["options"]["install_requires"].split()
    assert tuple(int(x) for x in torch.__version__.split(".")[:2]) == SUPPORTED_TORCH
    ruff = tomllib.loads((ROOT / "ruff.toml").read_text())
    assert ruff["target-version"] == "py311"
