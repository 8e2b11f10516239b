"""A compile_dir the cache cannot use costs a compile without the cache, never the run (cache.open_cache).

A table by class: each of the cache's folders (compile_dir itself, cs_run_cache, artifacts, inductor)
as a file, under a file, or not writable, and garbage where the cache keeps files. For every case the
step runs and gives eager PyTorch's values bit for bit (tier fx: the traced graph's own code), with one
warning naming the folder where the cache is turned off and none where it is usable; a slow case runs
tier inductor with its artifacts folder a file.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from cs_run.engine import CompiledStep, EngineOptions, cache
from cs_run.engine import compile as engine_compile
from tests.engine.helpers import make_sgd_step

PARTS = ("", "cs_run_cache", "artifacts", "inductor")  # "" is compile_dir itself


def _file(root, part):
    (root / part).parent.mkdir(parents=True, exist_ok=True)
    (root / part if part else root).write_text("not a folder")
    return root / part if part else root


def _under_file(root, part):  # compile_dir is root/part, and root is a file
    root.write_text("a file")
    return root


def _read_only(root, part):
    (root / part).mkdir(parents=True, exist_ok=True)
    (root / part).chmod(0o555)
    return root / part


def _garbage(root, part):
    root.mkdir(parents=True)
    (root / "cs_run_cache" / ("0" * 32)).mkdir(parents=True)  # an entry without summary.json
    (root / "cs_run_cache" / ("1" * 32)).write_text("an entry that is a file")
    (root / "artifacts").mkdir()
    (root / "artifacts" / "vec_isa.json").write_text("{not json")
    (root / "artifacts" / f"{'2' * 32}.{'3' * 24}.aoti.so").write_bytes(b"\x7fELF garbage")
    (root / "inductor").mkdir()
    (root / "inductor" / "junk").write_bytes(os.urandom(64))
    return None


CASES = [(f"{part or 'compile_dir'}-is-a-file", part, _file, "is not a folder") for part in PARTS]
CASES += [("compile_dir-under-a-file", "cached_compile", _under_file, "is not a folder"),
          ("garbage-inside", "", _garbage, None)]
if os.geteuid() != 0:  # root writes into read-only folders
    CASES += [(f"{part or 'compile_dir'}-read-only", part, _read_only, "is not writable") for part in PARTS]


def _batches():
    return [torch.randn(3, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]


def _run(compile_dir, tier, caplog):
    ref_model, ref_step = make_sgd_step()
    expected = [ref_step(x) for x in _batches()]
    model, step = make_sgd_step()
    compiled = CompiledStep(step, EngineOptions(compile_tier=tier, compile_dir=str(compile_dir)))
    with caplog.at_level(logging.WARNING, logger="cs_run"):
        losses = [compiled(x) for x in _batches()]
    return losses, expected, list(model.parameters()), list(ref_model.parameters())


@pytest.mark.parametrize("name, part, make, problem", CASES, ids=[c[0] for c in CASES])
def test_an_unusable_compile_dir_costs_the_cache_not_the_run(name, part, make, problem, tmp_path, caplog):
    root = tmp_path / "cc"
    blocker = make(root, part)
    if make is _under_file:
        root = root / part
    losses, expected, params, ref_params = _run(root, "fx", caplog)
    assert all(torch.equal(a, b) for a, b in zip(losses, expected))  # fx: the traced graph's own code, bit for bit
    assert all(torch.equal(p, q) for p, q in zip(params, ref_params))
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compile cache:")]
    if problem is None:
        assert warnings == [] and (root / "cs_run_cache").is_dir()
        assert len([p for p in (root / "cs_run_cache").iterdir() if (p / "summary.json").is_file()]) == 1
    else:
        assert warnings == [f"compile cache: {blocker} {problem}; compiling without the cache in {root} (nothing is "
                            "reused or saved); give --compile_dir a writable folder (or set CS_RUN_CACHE_DIR)"]


def test_the_warning_comes_once_per_folder_and_reason(tmp_path, caplog):
    root = _file(tmp_path / "cc", "artifacts").parent
    for _ in range(3):
        with caplog.at_level(logging.WARNING, logger="cs_run"):
            assert cache.open_cache(root) is None
    assert len([r for r in caplog.records if "compiling without the cache" in r.getMessage()]) == 1


@pytest.mark.slow
def test_inductor_with_its_artifacts_folder_a_file_compiles_without_the_cache(tmp_path, caplog):
    """The tier that writes most into compile_dir: its library, inductor's own caches, the ISA record.
    Inductor fuses and reorders float math: ~1e-6, not bit for bit."""
    if engine_compile.resolve_tier("auto", torch.device("cpu")) != "auto":
        pytest.skip("no C++ compiler: inductor cannot build here")
    root = tmp_path / "cc"
    _file(root, "artifacts")
    losses, expected, params, ref_params = _run(root, "inductor", caplog)
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(params, ref_params, rtol=1e-5, atol=1e-6)
    assert (root / "artifacts").read_text() == "not a folder"
    assert any(f"{root / 'artifacts'} is not a folder" in r.getMessage() for r in caplog.records)


def test_a_step_with_a_0d_tensor_constant_gets_a_cache_key(tmp_path):
    """A scalar tensor made inside the step (``torch.tensor(0.5)``) is a 0-d graph constant, which the key
    hashes byte for byte (a 0-d tensor cannot be viewed as bytes without flattening it first)."""
    weight = torch.ones(3)

    def step(x):
        return (x * torch.tensor(0.5) + weight).sum()

    compiled = CompiledStep(step, EngineOptions(compile_tier="fx", compile_dir=str(tmp_path)))
    x = torch.arange(3.0)
    assert torch.equal(compiled(x), step(x))


_ISA_RUN = """
import json, sys
import torch
torch.set_num_threads(1)
from cs_run.engine import CompiledStep, EngineOptions, aot
from cs_run.optim import SGD
aot.build = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("the Python-wrapper form, please"))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
opt = SGD(model.parameters(), lr=0.1)
ref = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
ref.load_state_dict(model.state_dict())
ref_opt = SGD(ref.parameters(), lr=0.1)

def make(m, o):
    def step(x, y):
        loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        o.step()
        o.zero_grad()
        return loss
    return step

compiled = CompiledStep(make(model, opt), EngineOptions(compile_tier="inductor", compile_dir=sys.argv[1]))
eager = make(ref, ref_opt)
g = torch.Generator().manual_seed(1)
pairs = []
for _ in range(4):
    x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
    pairs.append((float(compiled(x, y)), float(eager(x, y))))
print(json.dumps(pairs))
"""


@pytest.mark.slow
def test_a_compile_dir_filled_for_the_host_s_vector_isa_is_not_reused_under_another(tmp_path):
    """Inductor's own cache does not tell a build under ``ATEN_CPU_CAPABILITY`` from the host's: over a
    compile_dir the host's build filled, ``default`` failed to compile and ``avx2`` (on an AVX-512 host)
    gave losses of 1e36. The override is part of the key and has its own inductor folder. Each process
    compares its compiled steps with its eager ones (within 1e-5: inductor's kernels sum in their order)."""
    for capability in ("", "default"):
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        if capability:
            env["ATEN_CPU_CAPABILITY"] = capability
        result = subprocess.run([sys.executable, "-c", _ISA_RUN, str(tmp_path / "cd")], capture_output=True,
                                text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, (capability, result.stderr[-3000:])
        for compiled, eager in json.loads(result.stdout.strip().splitlines()[-1]):
            assert abs(compiled - eager) <= 1e-5 * abs(eager), (capability, compiled, eager)
    assert (tmp_path / "cd" / "inductor" / "aten-default").is_dir()
