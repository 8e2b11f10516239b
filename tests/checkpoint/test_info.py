"""`checkpoint info`: scalar values and the header (format and version, global step, parameter count),
checked against h5py and safetensors reading the same files, and the vendor's own reading of its file."""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cs_run.checkpoint import info, save
from cs_run.frontends.checkpoint_cli import checkpoint as cli
from tests.optim import vendor_golden


def _state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 3))
    sd = model.state_dict()
    sd["tied"] = sd["0.weight"]  # stored once, counted once
    return model, {
        "model": sd,
        "global_step": 1234,
        "optimizer": {"param_groups": [{"lr": torch.tensor(0.01), "momentum": 0.9, "nesterov": False}]},
        "scale": torch.tensor(2.5, dtype=torch.bfloat16),
        "name": "run/1",
        "long": "x" * 100,
        "none": None,
        "big": 2**70,
        "npscalar": np.float64(0.125),
    }


def _run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def test_h5_values_and_header_match_h5py(tmp_path):
    model, state = _state()
    path = tmp_path / "c.mdl"
    save(state, path)
    desc = json.loads(_run("info", path, "--json"))
    values = {k["key"]: k["value"] for k in desc["keys"] if "value" in k}
    with h5py.File(path, "r") as f:  # the datasets themselves, read by h5py
        want = {key: f[key][()] for key in ("global_step", "optimizer.param_groups.0.momentum",
                                            "optimizer.param_groups.0.nesterov", "npscalar")}
        assert values["optimizer.param_groups.0.lr"] == float(f["optimizer.param_groups.0.lr"][()])
        assert values["name"] == f["name"][()].decode()
        assert values["big"] == int(f["big"][()].decode())  # outside int64: stored as its decimal string
        assert f["none"].shape is None and values["none"] is None
        # bfloat16 is stored as its bit pattern: the value is the upper half of a float32
        bits = int(f["scale"][()].astype(np.uint16))
        assert values["scale"] == np.array([bits << 16], dtype=np.uint32).view(np.float32)[0] == 2.5
        model_sizes = {f[k].id.get_offset(): f[k].size for k in f if k.startswith("model.")}
    assert {k: values[k] for k in want} == {k: v.item() for k, v in want.items()}
    assert values["long"] == "x" * 100
    assert desc["global_step"] == 1234 == values["global_step"]
    # every model tensor once (the tied copy shares its data offset), buffers included
    assert desc["num_parameters"] == sum(model_sizes.values())
    assert desc["num_parameters"] == sum(t.numel() for t in model.state_dict().values())
    assert desc["parameter_tensors"] == len(model.state_dict())
    assert (desc["format"], desc["version"]) == ("cs_run.checkpoint", 1)

    text = _run("info", path).splitlines()
    assert text[:3] == [f"{path}: cs_run.checkpoint v1", "global step: 1234",
                        f"parameters:  {desc['num_parameters']:,} in {len(model.state_dict())} tensors under model. "
                        "(buffers included)"]
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in text[4:-1]}
    assert rows["global_step"] == ["int", "1234"]
    assert rows["optimizer.param_groups.0.lr"][1].startswith("float32[] = 0.01 ")
    assert rows["scale"][1].startswith("bfloat16[] = 2.5 ")
    assert rows["name"] == ["str", "'run/1'"] and rows["none"] == ["none", "None"]
    assert rows["long"] == ["str", repr("x" * 37 + "...")]
    assert rows["big"] == ["int", str(2**70)]


def test_safetensors_file_read_by_safetensors(tmp_path):
    st = pytest.importorskip("safetensors")
    import safetensors.torch

    tensors = {"wte.weight": torch.randn(7, 3), "h.0.ln.bias": torch.zeros(3), "step": torch.tensor(5)}
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file(tensors, str(path))
    desc = info(path)
    with st.safe_open(str(path), framework="pt") as f:
        count = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118 - safe_open API
        step = f.get_tensor("step").item()
    assert desc["num_parameters"] == count == 7 * 3 + 3 + 1  # no model. prefix: every tensor counts
    assert {k["key"]: k.get("value") for k in desc["keys"]}["step"] == step
    assert desc["global_step"] is None and desc["version"] is None
    text = _run("info", path)
    assert text.startswith(f"{path}: safetensors\nglobal step: -\nparameters:  25 in 3 tensors in the file")
    assert "vNone" not in text and text.splitlines()[-1].startswith("safetensors: 3 keys")


def test_torch_file_values(tmp_path):
    model, state = _state()
    del state["npscalar"]  # a numpy value in a plain torch.save file needs pickle to read
    path = tmp_path / "c.pt"
    torch.save(state, path)
    reference = torch.load(path, weights_only=False)
    desc = info(path)
    values = {k["key"]: k["value"] for k in desc["keys"] if "value" in k}
    assert values["global_step"] == reference["global_step"] == desc["global_step"]
    assert values["optimizer.param_groups.0.lr"] == reference["optimizer"]["param_groups"][0]["lr"].item()
    assert values["name"] == "run/1" and values["big"] == 2**70
    assert desc["num_parameters"] == sum(t.numel() for t in model.state_dict().values())
    assert "torch v" not in _run("info", path)


def test_vendor_file_values_are_what_the_vendor_loads():
    desc = info(vendor_golden.DATA / "kinds.mdl")
    got = {k["key"]: k["value"] for k in desc["keys"] if "value" in k}
    golden = vendor_golden.meta()["checkpoints"]["kinds_roundtrip"]
    want = {key: golden[key]["value"] for key in ("int", "float", "str", "none", "flag")}
    want["scalar"] = golden["scalar"]["values"][0]
    want.update({f"nested.list.{i}": v["value"] for i, v in enumerate(golden["nested"]["list"]["list"])})
    want.update({f"nested.tuple.{i}": v["value"] for i, v in enumerate(golden["nested"]["tuple"]["tuple"])})
    assert got == want
    tensors = [v for k, v in golden.items() if "tensor" in v and k != "tied_b"] + [golden["nested"]["deep"]["t"]]
    assert desc["num_parameters"] == sum(math.prod(v["shape"]) for v in tensors)  # tied_b is tied_a: once
    assert desc["global_step"] is None
