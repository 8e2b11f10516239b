"""The CPU inductor tier as one ahead-of-time library (cs_run/engine/aot.py): results against eager
PyTorch, batches with other strides, damaged saved libraries, and the fallback when the build fails."""

from __future__ import annotations

import hashlib
import logging

import pytest
import torch

from cs_run.engine import CompiledStep, EngineOptions, aot, cache
from cs_run.engine import compile as engine_compile
from cs_run.engine.state import discover_state
from cs_run.engine.trace import trace_step
from tests.engine.helpers import TraceSafeSGD, built, make_sgd_step

KEY = "0123456789abcdef0123456789abcdef"


def _library(folder, data: bytes, key: str = KEY):
    """A saved library as build() names it: the SHA-256 of its key and bytes (hashlib, not aot's code)."""
    path = folder / f"{key}.{hashlib.sha256(key.encode() + data).hexdigest()[:24]}.aoti.so"
    path.write_bytes(data)
    return path


DAMAGES = {
    "truncated": lambda b: b[: len(b) // 2],
    "emptied": lambda b: b"",
    "one byte flipped": lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:],
    "one byte appended": lambda b: b + b"\0",
    "replaced": lambda b: b"\x7fELF" + bytes(len(b) - 4),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_library_is_removed_never_returned(tmp_path, caplog, damage):
    data = bytes(range(256)) * 64
    path = _library(tmp_path, data)
    assert aot.find_artifact(tmp_path, KEY) == path
    path.write_bytes(DAMAGES[damage](data))
    with caplog.at_level(logging.WARNING, logger="cs_run"):
        assert aot.find_artifact(tmp_path, KEY) is None
    assert not path.exists()
    assert any("damaged" in r.getMessage() and path.name in r.getMessage() for r in caplog.records)


def test_another_graphs_library_under_this_key_is_removed_never_returned(tmp_path, caplog):
    """A library intact in itself but built for another key (copied or renamed into this key's name,
    its own digest kept) would load and fail on the first step's shapes: it is rebuilt instead."""
    data = bytes(range(256)) * 64
    theirs = _library(tmp_path, data, key="f" * 32)
    mine = theirs.with_name(KEY + theirs.name[32:])
    theirs.rename(mine)
    with caplog.at_level(logging.WARNING, logger="cs_run"):
        assert aot.find_artifact(tmp_path, KEY) is None
    assert not mine.exists()
    assert any("another graph's library" in r.getMessage() for r in caplog.records)


def test_only_the_keys_own_intact_library_is_found(tmp_path):
    other = _library(tmp_path, b"x", key="f" * 32)
    assert aot.find_artifact(tmp_path, KEY) is None  # another key's library
    (tmp_path / f"{KEY}.aoti.so").write_bytes(b"no digest")  # not a name build() writes
    bad = _library(tmp_path, b"old")
    bad.write_bytes(b"new")
    good = _library(tmp_path, b"intact")
    assert aot.find_artifact(tmp_path, KEY) == good
    assert other.exists() and good.exists()


class _RecordingRunner:
    """Stands in for torch's C++ runner: records what it is given, returns the inputs' sum."""

    def __init__(self) -> None:
        self.calls: list[list[torch.Tensor]] = []

    def run(self, inputs):
        self.calls.append(list(inputs))
        return [sum(t.sum() for t in inputs)]


def test_a_batch_with_other_strides_is_copied_into_the_built_strides():
    state = torch.randn(3)
    built = torch.randn(4, 6)  # contiguous: strides (6, 1)
    runner = _RecordingRunner()
    step = aot.AOTStep(runner, num_state=1, batch=[built], path=None)
    transposed = torch.randn(6, 4).t()  # same shape, strides (1, 4)
    step(state, transposed)
    step(state, built)
    (s0, b0), (s1, b1) = runner.calls
    assert s0 is state and b0.stride() == (6, 1) and torch.equal(b0, transposed)
    assert b1 is built  # already in the built strides: no copy


@pytest.mark.slow
def test_cpu_inductor_step_is_one_library_that_matches_eager_and_survives_damage(tmp_path, caplog):
    """Built once, saved under its digest, loaded by a second CompiledStep; after the file is damaged
    the next CompiledStep rebuilds it. Inductor fuses and reorders float math: ~1e-6, not bit for bit."""
    pytest.importorskip("torch._inductor")
    if engine_compile.resolve_tier("auto", torch.device("cpu")) != "auto":
        pytest.skip("no C++ compiler: inductor cannot build here")

    def batches():
        for i in range(4):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i))
            yield x if i % 2 else torch.randn(4, 3).t().copy_(x)  # every other batch transposed in memory

    ref_model, ref_step = make_sgd_step()
    expected = [ref_step(x.contiguous()) for x in batches()]
    for attempt in ("built", "loaded", "rebuilt"):
        before = dict(engine_compile.COUNTS)
        model, step = make_sgd_step()
        compiled = CompiledStep(step, EngineOptions(compile_tier="inductor", compile_dir=str(tmp_path)))
        with caplog.at_level(logging.WARNING, logger="cs_run"):
            losses = [compiled(x) for x in batches()]
        assert isinstance(built(compiled)[1], aot.AOTStep)
        torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
        for p, q in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        what = "inductor_load" if attempt == "loaded" else "inductor_compile"
        assert engine_compile.COUNTS[what] == before.get(what, 0) + 1, attempt
        libraries = list((tmp_path / "artifacts").glob("*.aoti.so"))
        assert len(libraries) == 1
        if attempt == "loaded":  # damage it (a new file: the loaded one stays mapped): it must not load
            damaged = tmp_path / "damaged"
            damaged.write_bytes(libraries[0].read_bytes()[:-1000])
            damaged.replace(libraries[0])
    assert any("damaged" in r.getMessage() for r in caplog.records)

    # The same library through its C interface with ctypes (how a step with collectives is called, the GIL
    # released): the same kernels, so the same bits as torch's runner, outputs and in-place state updates.
    traced = built(compiled)[0]
    library = next((tmp_path / "artifacts").glob("*.aoti.so"))
    x = next(batches())
    results = []
    for release_gil in (False, True):
        state = [t.detach().clone() for t in traced.state.tensors]
        loaded = aot.load(library, len(state), [x], release_gil=release_gil)
        assert isinstance(loaded._runner, aot.Library) == release_gil
        results.append((loaded(*state, x), state))
    (out_a, state_a), (out_b, state_b) = results
    assert all(torch.equal(a, b) for a, b in zip([*out_a, *state_a], [*out_b, *state_b], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(state_a, traced.state.tensors))  # the step updated them
    direct = aot.Library(library)
    with pytest.raises(aot.LibraryError, match=f"takes {len(state_a) + 1} tensors, not 1"):  # not an abort
        direct.run([x])
    with pytest.raises(aot.LibraryError, match="the step library's run failed"):  # any failed call: one error
        direct._check("run", 1)


def test_a_failed_ahead_of_time_build_falls_back_to_the_wrapper_form(monkeypatch, caplog):
    traced, x = _traced_linear_step()

    def failing_build(*args, **kwargs):
        raise RuntimeError("C++ compile failed: no space left on device\nmore detail")

    wrapper_calls = []
    monkeypatch.setattr(aot, "build", failing_build)
    monkeypatch.setattr(engine_compile, "_inductor_wrapper",
                        lambda *args: wrapper_calls.append(args) or ("wrapper executable", "compiled"))
    with caplog.at_level(logging.WARNING, logger="cs_run"):
        executable, how = engine_compile._inductor(traced, [x], None, KEY, "step")
    assert (executable, how) == ("wrapper executable", "compiled") and len(wrapper_calls) == 1
    [message] = [r.getMessage() for r in caplog.records if "ahead-of-time" in r.getMessage()]
    assert "RuntimeError: C++ compile failed: no space left on device" in message and "more detail" not in message


def test_an_inductor_build_is_keyed_on_the_cpu_threads_and_graph_passes(monkeypatch):
    """A saved library runs that CPU's instructions, parallelised for the builder's thread count, and was
    compiled from the graph as passes.py rewrote it: another CPU, thread count or version of the lowering
    must not load it. fx depends on none of them."""
    traced, x = _traced_linear_step()
    keys = {tier: cache.graph_key(traced, [x], tier) for tier in ("fx", "inductor")}
    for owner, name in ((cache, "_host_cpu"), (cache, "_lowering_digest"), (torch, "get_num_threads")):
        with monkeypatch.context() as m:
            m.setattr(owner, name, lambda: 1234)
            assert cache.graph_key(traced, [x], "inductor") != keys["inductor"], name
            assert cache.graph_key(traced, [x], "fx") == keys["fx"], name


def _traced_linear_step():
    """A traced SGD step of one Linear layer and its batch (no compile)."""
    model = torch.nn.Linear(3, 1)
    opt = TraceSafeSGD(model.parameters(), lr=0.1)

    def step(x):
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    x = torch.randn(2, 3)
    return trace_step(step, discover_state(step), (x,), {}), x
