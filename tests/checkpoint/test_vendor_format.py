"""The vendor's checkpoint format 0.5 both ways, checked against files the real package wrote and read.

tests/data/vendor_oracle holds (tools/vendor_oracle/record.py, tests/checkpoint/vendor_roundtrip.py):
``kinds.mdl`` and ``adamw_step30.mdl``, written by the vendor's ``cstorch.save`` (LZ4-compressed, as
it writes by default); ``csrun_written.mdl``, written by cs-run's writer, which the vendor loaded and
resumed its AdamW from (``csrun_resume.npz`` and ``.json``: what it loaded and its next 5 steps).
"""

from __future__ import annotations

import builtins
import json
import shutil

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cs_run.checkpoint import info, load, save
from cs_run.checkpoint import vendor_format as vf
from cs_run.errors import CheckpointError
from cs_run.frontends.checkpoint_cli import checkpoint as cli
from tests.checkpoint import vendor_roundtrip
from tests.optim import vendor_golden
from tests.ulps import ROUNDINGS_PER_STEP, assert_tree_within_ulps, assert_within_ulps

DATA = vendor_golden.DATA
# The recorded numbers come from another CPU (tests/ulps.py): a resumed AdamW step is forward, backward
# and update, and the gradient's own rounding differences reach a parameter only through Adam's
# normalised update lr * m / (sqrt(v) + eps), far below one ulp of the parameter at lr 0.01; what is
# left is ROUNDINGS_PER_STEP per step. Measured: 0 on AVX2, at most 1 with ATEN_CPU_CAPABILITY=default.
RESUME_ULPS = ROUNDINGS_PER_STEP * 20  # the vendor's run continued from step 30 for 20 steps
# cs-run's 5 steps before writing (csrun_written.mdl, what the vendor loaded); the tensors' magnitudes
# move by under 1% in 5 steps at lr 0.01, so each tensor's own largest value is its scale
WRITTEN_ULPS = ROUNDINGS_PER_STEP * vendor_roundtrip.STEPS


def _summary(obj):
    """The oracle's description of a loaded object (tools/vendor_oracle/record.py: _summary)."""
    if isinstance(obj, torch.Tensor):
        return {"tensor": str(obj.dtype), "shape": list(obj.shape), "values": obj.float().reshape(-1).tolist()}
    if isinstance(obj, dict):
        return {str(k): _summary(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return {type(obj).__name__: [_summary(v) for v in obj]}
    return {"py": type(obj).__name__, "value": obj}


def test_vendor_written_file_loads_as_the_vendor_loads_it():
    """Every leaf kind (dtypes incl. bf16, 0-d, empty, scalars, str, None, nesting, tuple, ties)."""
    loaded = load(DATA / "kinds.mdl")
    assert _summary(loaded) == vendor_golden.meta()["checkpoints"]["kinds_roundtrip"]
    assert loaded["tied_a"] is loaded["tied_b"] and isinstance(loaded["nested"]["tuple"], tuple)
    desc = info(DATA / "kinds.mdl")
    assert desc["format"] == "cerebras-h5" and desc["version"] == pytest.approx(0.5)


def test_vendor_adamw_checkpoint_resumes_and_continues_as_the_vendor():
    """A vendor AdamW run saved at step 30 by the real package: model and optimizer state load into
    cs-run, and the next 20 steps equal the vendor's own continuation (within RESUME_ULPS)."""
    import cs_run.optim as csoptim

    state = load(DATA / "adamw_step30.mdl")
    assert state["global_step"] == 30 and set(state["optimizer"]["state"][0]) == {
        "exp_avg", "exp_avg_sq", "beta1_power", "beta2_power"}
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    model.load_state_dict(state["model"])
    opt = csoptim.AdamW(model.parameters(), lr=0.5)  # lr and weight decay come from the checkpoint
    opt.load_state_dict(state["optimizer"])
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(0.01) and opt.param_groups[0]["weight_decay"] == 0.05
    x, y = vendor_roundtrip.data()
    with np.load(DATA / "adamw_resume.npz") as golden:
        for i in range(20):
            vendor_roundtrip.step(model, opt, x[30 + i], y[30 + i])
            for name, p in model.named_parameters():
                recorded = golden[f"param.{name}"]
                assert_within_ulps(p, recorded[i], RESUME_ULPS, np.abs(recorded[: i + 1]).max(), f"step {31 + i} {name}")


def test_csrun_checkpoint_resumes_in_the_vendor_as_here():
    """cs-run's file, loaded by the real package's cstorch.load, resumed its AdamW; the vendor's next 5
    steps (recorded) equal cs-run's own continuation. The state is cs-run's 5 steps trained here, the
    vendor's continuation 5 more: both within the 10 steps' bound."""
    recorded = json.loads((DATA / "csrun_resume.npz.json").read_text())
    state, model, opt = vendor_roundtrip.training_state()
    # what the vendor read is what cs-run wrote: structure exact, trained values within WRITTEN_ULPS
    assert_tree_within_ulps(_summary(state), recorded["loaded"], WRITTEN_ULPS, "loaded")
    x, y = vendor_roundtrip.data()
    with np.load(DATA / "csrun_resume.npz") as golden:
        for k, i in enumerate(range(5, 10)):
            vendor_roundtrip.step(model, opt, x[i], y[i])
            for name, p in model.named_parameters():
                recorded = golden[f"param.{name}"]
                assert_within_ulps(p, recorded[k], ROUNDINGS_PER_STEP * (i + 1), np.abs(recorded[: k + 1]).max(),
                                   f"step {i + 1} {name}")


def _h5_content(path):
    with h5py.File(path, "r") as f:
        attrs = {k: (json.loads(v) if isinstance(v, str) and v.startswith(("{", "[")) else v) for k, v in f.attrs.items()}
        data = {k: (f[k][()].tolist(), {a: np.asarray(f[k].attrs[a]).tolist() for a in f[k].attrs}) for k in f}
    return attrs, data


def test_writer_still_writes_the_file_the_vendor_read(tmp_path):
    state, _, _ = vendor_roundtrip.training_state()
    vf.save(state, tmp_path / "again.mdl")
    # the same keys, attributes, dtypes and shapes; the trained values (5 steps here) within WRITTEN_ULPS
    assert_tree_within_ulps(_h5_content(tmp_path / "again.mdl"), _h5_content(DATA / "csrun_written.mdl"),
                            WRITTEN_ULPS, "csrun_written.mdl")


def test_round_trip_of_every_kind(tmp_path):
    shared = torch.arange(6.0).reshape(2, 3)
    obj = {"f": torch.linspace(0, 1, 4), "bf": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
           "i": torch.tensor([[1, 2]], dtype=torch.int32), "b": torch.tensor([True]), "s": torch.tensor(3.0),
           "e": torch.zeros(0, 2), "a": shared, "t": shared, "n": None, "x": "text", "k": 3, "r": 0.5, "y": False,
           "state": {0: {"m": torch.ones(2)}, 1: {"m": torch.zeros(2)}}, "tup": (1, [2, "3"]),
           "arr": np.arange(4, dtype=np.float64)}
    vf.save(obj, tmp_path / "v.mdl")
    back = load(tmp_path / "v.mdl")
    assert _summary({k: v for k, v in back.items() if k != "arr"}) == _summary({k: v for k, v in obj.items() if k != "arr"})
    assert back["a"] is back["t"] and list(back["state"]) == [0, 1] and isinstance(back["tup"], tuple)
    np.testing.assert_array_equal(back["arr"], obj["arr"])


def test_convert_to_vendor_from_the_cli(tmp_path):
    obj = {"model": {"w": torch.randn(3, 2)}, "step": 4}
    save(obj, tmp_path / "c.h5")
    result = CliRunner().invoke(cli, ["convert", str(tmp_path / "c.h5"), str(tmp_path / "v.mdl"), "--to", "vendor"])
    assert result.exit_code == 0, result.output
    assert "(vendor)" in result.output
    with h5py.File(tmp_path / "v.mdl", "r") as f:
        assert f.attrs["__version__"] == 0.5 and f.attrs["__SUCCESS__"]
    back = load(tmp_path / "v.mdl")
    assert torch.equal(back["model"]["w"], obj["model"]["w"]) and back["step"] == 4


@pytest.mark.parametrize("value,regex", [
    (torch.zeros(2, dtype=torch.complex64), r"tensor 'v' is torch.complex64, which the vendor format cannot hold"),
    (torch.zeros(2, dtype=torch.int8), r"tensor 'v' is torch.int8"),
    (b"raw", r"key 'v' is a bytes, which the vendor format cannot hold"),
])
def test_writer_refuses_what_the_format_cannot_hold(tmp_path, value, regex):
    with pytest.raises(CheckpointError, match=regex):
        vf.save({"v": value}, tmp_path / "x.mdl")
    assert not (tmp_path / "x.mdl").exists()


def test_writer_refuses_a_key_clash(tmp_path):
    with pytest.raises(CheckpointError, match=r"two leaves have the flattened key 'a.b'"):
        vf.save({"a.b": 1, "a": {"b": 2}}, tmp_path / "x.mdl")


def _copy(tmp_path, name="kinds.mdl"):
    dst = tmp_path / name
    shutil.copy(DATA / name, dst)
    return dst


def test_incomplete_vendor_file(tmp_path):
    path = _copy(tmp_path)
    with h5py.File(path, "a") as f:
        del f.attrs["__SUCCESS__"]
    with pytest.raises(CheckpointError, match=r"is incomplete \(vendor format 0.5 without __SUCCESS__\)"):
        load(path)


def test_unknown_vendor_leaf_type(tmp_path):
    path = _copy(tmp_path)
    with h5py.File(path, "a") as f:
        meta = json.loads(f.attrs["str.__metadata__"])
        meta["str.__metadata__"]["__TYPE__"] = "ObjectSerializer"
        f.attrs["str.__metadata__"] = json.dumps(meta)
    with pytest.raises(CheckpointError, match=r"key 'str' has vendor type 'ObjectSerializer', which cs-run does not read"):
        load(path)


def test_missing_lz4_filter_says_what_to_install(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_hdf5plugin(name, *args, **kwargs):
        if name == "hdf5plugin":
            raise ImportError("No module named 'hdf5plugin'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_hdf5plugin)
    with pytest.raises(CheckpointError, match=r"are LZ4-compressed, as the vendor writes them; install hdf5plugin"):
        load(_copy(tmp_path))


def test_unsupported_vendor_container_names_its_place(tmp_path):
    # tree.spec_tree walks the vendor's treespec: a container cs-run does not store is refused at its key
    path = _copy(tmp_path)
    with h5py.File(path, "a") as f:
        readable, spec = json.loads(f.attrs["__spec__"])
        protocol, root = json.loads(spec)
        key = json.loads(root["context"])[0]
        root["children_spec"][0] = {"type": "builtins.set", "context": "null", "children_spec": []}
        f.attrs["__spec__"] = json.dumps([readable, json.dumps([protocol, root])])
    with pytest.raises(CheckpointError, match=rf"container type 'builtins.set' at '{key}' is not supported"):
        load(path)
