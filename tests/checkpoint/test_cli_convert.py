"""`checkpoint convert|info` and the conversion functions; `import cs_run` stays free of h5py."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from ckpt_helpers import assert_same
from click.testing import CliRunner

from cs_run.checkpoint import load, save
from cs_run.frontends.checkpoint_cli import checkpoint as cli


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


def _runner_like_state():
    """What a runner checkpoint holds: nested state dicts, numpy RNG state, ints, strings, None, ties."""
    w = torch.randn(4, 3)
    sd = torch.nn.Linear(3, 4).state_dict()
    return {"model": {"w": w, "tied": w, **sd}, "global_step": 7, "name": "run", "none": None, "blob": b"\x00\xff",
            "rng": {"numpy": ("MT19937", np.arange(624, dtype=np.uint32), 5, 0, 0.0), "scalar": np.float32(2.5),
                    "be": np.arange(3, dtype=">i4"), "c": 1 + 2j, "big": 1 << 70}}


def test_pt_written_by_convert_loads_with_weights_only_and_converts_back_losslessly(tmp_path):
    obj = _runner_like_state()
    save(obj, tmp_path / "a.mdl")
    assert _run("convert", tmp_path / "a.mdl", tmp_path / "a.pt").exit_code == 0
    plain = torch.load(tmp_path / "a.pt", weights_only=True)  # torch's own safe loader reads it
    assert torch.equal(plain["model"]["w"], obj["model"]["w"]) and plain["global_step"] == 7
    assert plain["rng"]["numpy"][1]["__cs_run__"] == "ndarray"  # numpy values are tagged, not pickled
    assert_same(obj, load(tmp_path / "a.pt"))  # cs-run turns the tags back into numpy values
    assert _run("convert", tmp_path / "a.pt", tmp_path / "b.mdl").exit_code == 0
    back = load(tmp_path / "b.mdl")
    assert_same(obj, back)
    assert back["model"]["tied"] is back["model"]["w"]
    assert _run("info", tmp_path / "a.pt").exit_code == 0


def test_pt_refuses_pickled_objects_by_key(tmp_path):
    save({"ok": torch.ones(1), "obj": {1, 2}}, tmp_path / "p.mdl", allow_pickle=True)
    result = _run("convert", tmp_path / "p.mdl", tmp_path / "p.pt", "--allow_pickle")
    assert result.exit_code == 1 and "key 'obj'" in result.output and result.output.count("\n") == 1
    assert not (tmp_path / "p.pt").exists()


@pytest.mark.parametrize("name", ["c.pt", "c.safetensors", "c.mdl"])
def test_info_verify_on_every_format_never_crashes(tmp_path, name):
    obj = {"model": {"w": torch.randn(3, 2), "b": torch.ones(2)}, "step": 1}
    save(obj, tmp_path / "src.mdl")
    assert _run("convert", tmp_path / "src.mdl", tmp_path / name).exit_code == 0 or name == "c.mdl"
    path = tmp_path / (name if name != "c.mdl" else "src.mdl")
    result = _run("info", path, "--verify")
    assert result.exit_code == 0, result.output
    desc = json.loads(_run("info", path, "--verify", "--json").output)
    if name == "c.mdl":
        assert desc["verified"] == 2 and desc["unverified"] == [] and "checksums: 2 good, 0 damaged" in result.output
    else:  # torch and safetensors record no per-tensor checksum: unverified, never counted good
        assert desc["verified"] == 0 and sorted(desc["unverified"]) == ["model.b", "model.w"]
        assert "0 good, 0 damaged, 2 unverified" in result.output


@pytest.mark.parametrize("dst", ["out.pt", "out.safetensors", "out.mdl"])
def test_convert_to_a_full_disk_is_one_error_line_and_leaves_nothing(tmp_path, dst):
    """A real full disk: a 64 KiB tmpfs (skipped where mounting is not allowed), and a write size limit
    (RLIMIT_FSIZE, any machine) in a child process; both end in one Error line, nothing left behind."""
    import subprocess

    save({"w": torch.randn(256, 256)}, tmp_path / "a.mdl")  # 256 KiB: does not fit
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))\n"
        "from cs_run.frontends.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    out = tmp_path / "limited"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", code, "checkpoint", "convert", str(tmp_path / "a.mdl"),
                           str(out / dst)], capture_output=True, text=True)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("Error: "), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(out.iterdir()) == []  # no partial file, no temporary
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        result = _run("convert", tmp_path / "a.mdl", mnt / dst)
        assert result.exit_code == 1 and result.output.count("\n") == 1 and result.output.startswith("Error: ")
        assert "No space left" in result.output
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.parametrize("dst", ["out.pt", "out.safetensors", "out.mdl"])
def test_convert_to_a_read_only_folder_is_one_error_line(tmp_path, dst):
    import os
    import subprocess

    save({"w": torch.ones(4)}, tmp_path / "a.mdl")
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root ignores permissions: a read-only mount instead
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)],
                          capture_output=True).returncode:
            pytest.skip("running as root and cannot mount a read-only tmpfs")
    else:
        ro.chmod(0o555)
    try:
        result = _run("convert", tmp_path / "a.mdl", ro / dst)
        assert result.exit_code == 1 and result.output.count("\n") == 1 and result.output.startswith("Error: "), \
            result.output
        assert str(ro / dst) in result.output
        assert list(ro.iterdir()) == []
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], check=True)
        else:
            ro.chmod(0o755)


def test_checkpoint_cli_does_not_import_the_examples():
    # The Hugging Face converters belong to their models (cs_run.registry names them, loaded when a conversion
    # asks); the checkpoint package imports nothing above it (tests/test_imports.py checks the layers).
    code = ("import sys, cs_run.frontends.checkpoint_cli; "
            "bad = [m for m in sys.modules if m.startswith('cs_run.examples')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_hf_conversion_of_a_model_without_a_converter_is_one_error_line(tmp_path):
    save({"model": {"w": torch.ones(2)}}, tmp_path / "c.mdl")
    (tmp_path / "params_resolved.yaml").write_text("model:\n  name: fc_mnist\n")
    result = _run("convert", "--to", "hf", tmp_path / "c.mdl", tmp_path / "hf")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "model.name" in result.output and "'fc_mnist' has no Hugging Face converter (models with one: bert " \
        "(model_type roberta), bert/classifier, bert/token_classifier, bloom, " in result.output \
        and "gpt-neox (model_type gpt_neox)" in result.output
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "xlnet"}')
    result = _run("convert", "--from", "hf", tmp_path / "hf", tmp_path / "x.mdl")
    assert result.exit_code == 2 and "config.json: model_type: 'xlnet' has no Hugging Face converter" in result.output
    (tmp_path / "hf" / "config.json").write_text("{not json")
    result = _run("convert", "--from", "hf", tmp_path / "hf", tmp_path / "x.mdl")
    assert result.exit_code == 1 and "config.json: not valid JSON" in result.output
    assert not (tmp_path / "x.mdl").exists()


@pytest.mark.parametrize("existing", ["file", "empty file", "folder", "dangling link", "params of --from hf"])
def test_convert_never_replaces_an_existing_destination_without_overwrite(tmp_path, existing):
    obj = _obj()
    save(obj, tmp_path / "a.h5")
    dst = tmp_path / "b.mdl"
    if existing == "file":
        save({"kept": torch.ones(1)}, dst)
    elif existing == "empty file":
        dst.write_bytes(b"")
    elif existing == "folder":
        dst.mkdir()
    elif existing == "dangling link":
        dst.symlink_to(tmp_path / "nowhere")
    before = dst.read_bytes() if dst.is_file() else None
    args = ["convert", tmp_path / "a.h5", dst]
    if existing == "params of --from hf":
        (tmp_path / "b.yaml").write_text("model: {}\n")
        args = ["convert", "--from", "hf", tmp_path / "hf", dst]
    refused = _run(*args)
    assert refused.exit_code == 2 and "already exist" in refused.output and "--overwrite" in refused.output
    assert refused.output.count("\n") == 1  # one line
    if before is not None:
        assert dst.read_bytes() == before
    if existing == "file":
        assert _run(*args, "--overwrite").exit_code == 0
        assert_same(obj, load(dst))
