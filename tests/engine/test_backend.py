"""Backend rules: one type per process (vendor text), device/backend exclusivity, configure()."""

from __future__ import annotations

import os

import pytest
import torch

import cs_run as cstorch
from cs_run.backend import resolve_backend
from cs_run.errors import ParamsError


def test_second_backend_of_another_type_raises_vendor_error():
    cstorch.backend("CSX")
    with pytest.raises(RuntimeError) as info:
        cstorch.backend("CPU")
    assert str(info.value) == ("Cannot instantiate multiple backends. A backend with type CSX has already been "
                               "instantiated.")


def test_same_type_may_be_created_again_with_other_options():
    first = cstorch.backend("CSX", cluster_config=cstorch.distributed.ClusterConfig(num_csx=4))
    first.cluster_config.num_csx = 2
    second = cstorch.backend("CSX", cluster_config={"num_csx": 1, "num_workers_per_csx": 2})
    assert cstorch.backend() is second and second.cluster_config.num_workers_per_csx == 2
    assert first.cluster_config.num_csx == 2


def test_device_and_backend_are_mutually_exclusive():
    with pytest.raises(ValueError) as info:
        resolve_backend(device="CSX", backend=cstorch.backend("CSX"))
    assert str(info.value) == ("backend and device are mutually exclusive arguments of Trainer. "
                               "Please only provide one or the other")


def test_resolve_backend_forms():
    assert resolve_backend(device="CPU").is_cpu
    assert resolve_backend(backend={"backend_type": "CPU", "compile_dir": "x"}).compile_dir == "x"
    assert resolve_backend().is_cpu


def test_backend_properties_and_device_context(tmp_path):
    be = cstorch.backend("CSX", artifact_dir=tmp_path)
    assert be.is_csx and not be.is_cpu and not be.is_gpu
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert be.torch_device.type == expected
    assert be.compile_dir == os.environ["CS_RUN_CACHE_DIR"]  # the per-user cache (the suite's: tests/conftest.py)
    with be.device:
        assert torch.empty(1).device.type == expected


def test_configure_builds_csx_backend_from_flat_options(tmp_path):
    be = cstorch.configure(model_dir=str(tmp_path), compile_dir=str(tmp_path / "c"), checkpoint_steps=10,
                           num_csx=2, max_wgt_servers=4, mount_dirs=["/a"], python_paths=["/b"],
                           transfer_processes=3, num_workers_per_csx=1, job_labels=["k=v"], max_act_per_csx=1)
    assert be.is_csx and be.checkpoint_steps == 10 and be.cluster_config.num_csx == 2
    assert be.cluster_config.mount_dirs == ["/a"] and be.artifact_dir == str(tmp_path)


@pytest.mark.parametrize("call,match", [
    (lambda: cstorch.backend("TPU"), "Invalid backend type 'TPU'; must be one of CPU, GPU, CSX"),
    (lambda: cstorch.backend("CSX", compile_tier="fast"), "Invalid compile_tier 'fast'"),
    (lambda: cstorch.backend("CSX", bogus=1), "unknown option"),
    (lambda: cstorch.backend("CSX", compile_only=True, validate_only=True), "mutually exclusive"),
    (lambda: cstorch.configure(num_cs=2), "unknown option"),
    (lambda: cstorch.distributed.ClusterConfig(num_csx=0), "num_csx"),
    (lambda: cstorch.distributed.ClusterConfig(job_labels=["novalue"]), "key=value"),
])
def test_bad_backend_options(call, match):
    with pytest.raises((ParamsError, ValueError), match=match):
        call()


def test_compile_prepares_only_and_maps_vendor_names():
    cstorch.configure()
    model = torch.nn.Linear(2, 2)
    before = model.weight.detach().clone()
    assert cstorch.compile(model, backend="wse_ws") is model
    assert torch.equal(model.weight, before) and model in cstorch.backend().models
    with pytest.raises(RuntimeError, match="Cannot instantiate multiple backends"):
        cstorch.compile(model, backend="CPU")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        cstorch.compile(lambda x: x)


def test_topology_helpers_single_process(monkeypatch):
    from cs_run import distributed as d

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert (d.num_streamers(), d.get_streaming_rank(), d.get_ordinal(), d.is_master_ordinal()) == (1, 0, 0, True)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert d.get_streaming_batch_size(64) == 16 and not d.is_master_ordinal()
    with pytest.raises(ValueError, match="must split evenly over them; use 8 or 12"):
        d.get_streaming_batch_size(10)
