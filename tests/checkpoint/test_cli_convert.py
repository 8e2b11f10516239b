"""`checkpoint convert|info` and the conversion functions; `import cs_run` stays free of h5py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from ckpt_helpers import assert_same
from click.testing import CliRunner

from cs_run.checkpoint import load, save
from cs_run.checkpoint.cli import checkpoint as cli


def _obj():
    w = torch.randn(3, 2)
    return {"model": {"w": w, "tied": w, "bf": torch.ones(2, dtype=torch.bfloat16)}, "step": 9, "name": "run", "none": None}


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.parametrize("cmd", [[], ["convert"], ["info"]])
def test_help(cmd):
    result = _run(*cmd, "--help")
    assert result.exit_code == 0 and "Usage" in result.output


def test_info_text_and_json(tmp_path):
    save(_obj(), tmp_path / "c.h5")
    text = _run("info", tmp_path / "c.h5")
    assert text.exit_code == 0 and "model.w" in text.output and "tied to model.w" in text.output
    assert "cs_run.checkpoint v1" in text.output
    desc = json.loads(_run("info", tmp_path / "c.h5", "--json").output)
    assert desc["total_bytes"] == 3 * 2 * 4 + 2 * 2  # tensor data; the tied copy costs nothing
    assert {k["key"] for k in desc["keys"]} == {"model.w", "model.tied", "model.bf", "step", "name", "none"}


@pytest.mark.parametrize("middle", ["c.pt", "c.safetensors"])
def test_convert_roundtrip_through_other_formats(tmp_path, middle):
    obj = _obj()
    save(obj, tmp_path / "a.h5")
    assert _run("convert", tmp_path / "a.h5", tmp_path / middle).exit_code == 0
    mid = load(tmp_path / middle)
    assert_same(obj, mid)
    assert mid["model"]["tied"] is mid["model"]["w"] or middle == "c.pt"
    assert _run("convert", tmp_path / middle, tmp_path / "b.mdl").exit_code == 0
    back = load(tmp_path / "b.mdl")
    assert_same(obj, back)
    assert back["model"]["tied"] is back["model"]["w"]


def test_torch_file_from_elsewhere_converts(tmp_path):
    sd = torch.nn.Linear(3, 2).state_dict()
    torch.save(sd, tmp_path / "x.bin")
    assert _run("convert", tmp_path / "x.bin", tmp_path / "x.out", "--to", "h5").exit_code == 0
    assert_same(sd, load(tmp_path / "x.out"))
    plain = tmp_path / "plain.safetensors"
    import safetensors.torch

    safetensors.torch.save_file({"a": torch.ones(2)}, plain)
    assert_same({"a": torch.ones(2)}, load(plain))
    assert _run("info", plain).exit_code == 0


def test_convert_errors(tmp_path):
    save(_obj(), tmp_path / "a.h5")
    bad_ext = _run("convert", tmp_path / "a.h5", tmp_path / "out.xyz")
    assert bad_ext.exit_code == 2 and bad_ext.output.startswith("Error: cannot tell the format")
    same = _run("convert", tmp_path / "a.h5", tmp_path / "a.h5", "--to", "h5")
    assert same.exit_code == 2 and "same file" in same.output
    missing = _run("convert", tmp_path / "nope.h5", tmp_path / "b.h5")
    assert missing.exit_code == 1 and "does not exist" in missing.output
    save({"b": b"raw"}, tmp_path / "bytes.h5")
    to_st = _run("convert", tmp_path / "bytes.h5", tmp_path / "b.safetensors")
    assert to_st.exit_code == 1 and "key 'b' is a bytes" in to_st.output
    assert not (tmp_path / "b.safetensors").exists()


def test_import_cs_run_does_not_import_h5py():
    code = "import sys, cs_run; cs_run.save; cs_run.load; assert 'h5py' not in sys.modules, 'h5py imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
