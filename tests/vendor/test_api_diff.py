"""tools/api_diff.py: cs-run's public API against the vendor's 2.10 names and signatures (a data file read
from the wheel); every difference is either fixed or declared deliberate with its reason."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "api_diff.py"


@pytest.fixture(scope="module")
def api_diff():
    spec = importlib.util.spec_from_file_location("api_diff", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["api_diff"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("api_diff", None)


def test_no_undeclared_difference(api_diff):
    out = io.StringIO()
    code = api_diff.run(out)
    assert code == 0, out.getvalue()
    assert " 0 undeclared mismatch" in out.getvalue()


@pytest.mark.parametrize("vendor,local,expected", [
    ("(shape, dtype=None)", "(shape, dtype=None, *size, **kwargs)", []),
    ("(shape, dtype=None)", "(size, dtype=None)", ["positional 0 is 'size', vendor 'shape'",
                                                    "extra required parameter 'size'"]),
    ("(name)", "(name=None)", ["name: default None, vendor required"]),
    ("(x, *, lr=0.1)", "(x, *, lr=0.2)", ["lr: default 0.2, vendor 0.1"]),
    ("(x, **kwargs)", "(x)", ["no **kwargs"]),
    ("(x)", "(x, y)", ["extra required parameter 'y'"]),
    ("(default=torch.float32)", "(default=torch.float16)", ["default: default torch.float16, vendor torch.float32"]),
])
def test_signature_rules(api_diff, vendor, local, expected):
    namespace: dict = {}
    exec(f"import torch\ndef f{local}: pass", namespace)  # noqa: S102 - a signature literal of the test
    assert api_diff.compare_signature(api_diff._parse_sig(vendor), api_diff._local_params(namespace["f"])) == expected


def test_the_vendor_list_covers_the_names_model_zoo_scripts_call(api_diff):
    names = {e.name for e in api_diff.read_vendor()}
    for name in ("backend", "current_backend", "current_torch_device", "use_cs", "save", "load", "full", "zeros",
                 "zeros_like", "step_closure", "amp.GradScaler", "amp.set_half_dtype", "amp.get_half_dtype",
                 "amp.get_floating_point_dtype", "metrics.AccuracyMetric", "distributed.is_streamer",
                 "distributed.num_tasks", "distributed.is_master_ordinal", "distributed.get_streaming_batch_size",
                 "utils.data.DataExecutor", "utils.data.DistributedSampler", "utils.data.RestartableDataLoader",
                 "utils.data.Schedule", "utils.data.DataLoader.is_restartable", "utils.tensorboard",
                 "backend.BackendType.name", "experimental"):
        assert f"cerebras.pytorch.{name}" in names
