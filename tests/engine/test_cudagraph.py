"""CUDA-graph replay (cudagraph.py), tested without a GPU: the capture decision on real traced graphs,
and GraphedStep's static-buffer, cloning and fallback logic with an emulated capture on CPU tensors
(a capture records and runs nothing; a replay recomputes into the same output tensors)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from cs_run.engine import CompiledStep, EngineOptions
from cs_run.engine.cudagraph import GraphedStep, capture_blocker
from cs_run.optim import SGD
from tests.engine.helpers import MLP

CPU = torch.device("cpu")


def emulated_capture(state, log):
    """A CPU stand-in for ``cuda_capture``: nothing runs at the capture (the state is restored), and
    each replay writes the step's outputs into the same static tensors, as a CUDA graph does."""
    def capture(fn):
        saved = [t.clone() for t in state]
        static = list(fn())
        for t, s in zip(state, saved):
            t.copy_(s)
        log.append("capture")

        def replay():
            log.append("replay")
            for s, o in zip(static, fn()):
                if isinstance(s, torch.Tensor):
                    s.copy_(o)

        return replay, static

    return capture


def make_step(seed=0):
    torch.manual_seed(seed)
    model = MLP(in_features=6, hidden=8, depth=2, classes=3)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        loss = torch.nn.functional.nll_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return model, step


def batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)


def graphed_pair(capture_log, capture=None):
    """A CompiledStep whose executable is wrapped in a GraphedStep, and a plain reference one."""
    model, step = make_step()
    ref_model, ref_step = make_step()
    compiled = CompiledStep(step, EngineOptions(compile_tier="fx"))
    reference = CompiledStep(ref_step, EngineOptions(compile_tier="fx"))
    first = batch(0)
    assert torch.equal(compiled(*first), reference(*first))  # traces both
    sig, (traced, executable) = next(iter(compiled._executables.items()))
    wrapped = GraphedStep(executable, len(traced.state.tensors), keep=tuple(traced.layout.rebinds),
                          capture=capture or emulated_capture(traced.state.tensors, capture_log), label="step")
    compiled._executables[sig] = (traced, wrapped)
    return model, compiled, ref_model, reference, wrapped


def test_graphed_step_copies_each_batch_into_static_buffers_and_matches_plain_replay():
    log = []
    model, compiled, ref_model, reference, wrapped = graphed_pair(log)
    losses, buffers = [], []
    for i in range(1, 7):
        loss = compiled(*batch(i))
        losses.append(loss)
        assert torch.equal(loss, reference(*batch(i))), i
        buffers.append([b.data_ptr() for b in wrapped._static])
    assert log == ["capture"] + ["replay"] * 5  # call 1 plain, call 2 captures and replays, then replays
    assert wrapped.graphed and not wrapped.fallback
    assert all(b == buffers[1] for b in buffers[1:])  # the same static input buffers every step
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)
    # returned outputs are clones: the next replay did not overwrite earlier steps' losses
    assert len({float(x) for x in losses}) == len(losses)
    assert all(x.data_ptr() != y.data_ptr() for x, y in zip(losses, losses[1:]))


def test_a_reallocated_state_tensor_falls_back_with_the_reason(caplog):
    log = []
    model, compiled, ref_model, reference, wrapped = graphed_pair(log)
    for i in range(1, 4):
        compiled(*batch(i))
        reference(*batch(i))
    for m in (model, ref_model):  # same object, new storage: a captured graph would write the old one
        first = next(m.parameters())
        first.data = first.data.clone()
    with caplog.at_level(logging.WARNING, logger="cs_run"):
        for i in range(4, 7):
            assert torch.equal(compiled(*batch(i)), reference(*batch(i)))
    assert "reallocated" in wrapped.fallback
    assert sum("no CUDA graph" in r.message and "reallocated" in r.message for r in caplog.records) == 1
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)


def test_a_failing_capture_falls_back_and_the_step_still_runs(caplog):
    def broken(fn):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    model, compiled, ref_model, reference, wrapped = graphed_pair([], capture=broken)
    with caplog.at_level(logging.WARNING, logger="cs_run"):
        for i in range(1, 5):
            assert torch.equal(compiled(*batch(i)), reference(*batch(i)))
    assert wrapped.fallback == "the capture failed (RuntimeError: operation not permitted when stream is capturing)"
    assert sum("no CUDA graph" in r.message for r in caplog.records) == 1
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)


def traced_step_graph():
    model, step = make_step()
    compiled = CompiledStep(step, EngineOptions(compile_tier="fx"))
    compiled(*batch(0))
    traced = next(iter(compiled._executables.values()))[0]
    return traced.gm, [*traced.state.tensors, *batch(1)]


def test_a_whole_training_step_is_capturable_and_host_inputs_are_not():
    gm, inputs = traced_step_graph()
    assert capture_blocker(gm, inputs, CPU) == ""
    reason = capture_blocker(gm, inputs, torch.device("meta"))  # the inputs are not on the step's device
    assert reason.startswith("graph input 0 ") and "is on cpu, not meta" in reason
    assert "is a int" in capture_blocker(gm, [*inputs[:-1], 3], CPU)


@pytest.mark.parametrize("fn,expect", [
    (lambda x: torch.nonzero(x).float().sum(), "nonzero reads a value on the host"),
    (lambda x: x[x > 0].sum(), "indexes with a boolean mask"),
    (lambda x: torch.masked_select(x, x > 0), "masked_select reads a value on the host"),
    (lambda x: torch.unique(x), "unique"),
    (lambda x: x.to("meta") * 2, "computes on meta, not cpu"),
])
def test_host_syncs_and_value_dependent_shapes_block_the_capture(fn, expect):
    gm = make_fx(fn, tracing_mode="real")(torch.randn(4, 3))
    assert expect in capture_blocker(gm, [torch.randn(4, 3)], CPU)


def one_op_graph(op, *extra):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(op, (x, *extra)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_a_host_read_blocks_the_capture():  # what .item() traces to (the engine refuses it earlier)
    gm = one_op_graph(torch.ops.aten._local_scalar_dense.default)
    assert "_local_scalar_dense reads a value on the host" in capture_blocker(gm, [torch.randn(())], CPU)


def test_symbolic_shapes_and_collectives_block_the_capture():
    gm = make_fx(lambda x: (x * 2).sum(0), tracing_mode="symbolic")(torch.randn(4, 3))
    assert "symbolic shape" in capture_blocker(gm, [torch.randn(4, 3)], CPU)
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    reduced = graph.call_function(torch.ops._c10d_functional.all_reduce.default, (x, "sum", "0"))
    graph.output(graph.call_function(torch.ops._c10d_functional.wait_tensor.default, (reduced,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert "collective op _c10d_functional.all_reduce" in capture_blocker(gm, [torch.randn(3)], CPU)


def test_cpu_steps_are_never_wrapped():
    model, step = make_step()
    compiled = CompiledStep(step, EngineOptions(compile_tier="fx"))
    compiled(*batch(0))
    executable = next(iter(compiled._executables.values()))[1]
    assert not isinstance(executable, GraphedStep)
