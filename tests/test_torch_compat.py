"""cs_run/_torch_compat.py against the running torch: the private APIs it names exist here, the pytree forms
cs-run reads and writes by hand are torch's own, and a missing API degrades with one warning.

This file runs on every torch the CI uses (``make test`` on 2.13, ``make test-torch-2.14``), so a torch
that moves one of these fails here by name instead of deep inside a trace.
"""

from __future__ import annotations

import collections
import json
import logging
import pickle
import pickletools
import types

import pytest
import torch
import torch.utils._pytree as torch_pytree

from cs_run import _torch_compat
from cs_run._version_check import SUPPORTED_TORCH

_TREES = [  # the containers a checkpoint holds: dict, OrderedDict, list, tuple, nested, and a bare leaf
    {"model": {"w": 1, "b": 2}, "optimizer": {"state": {}, "param_groups": [{"lr": 3, "params": [4, 5]}]}},
    collections.OrderedDict([("b", 1), ("a", (2, [3, None]))]),
    [1, (2, 3), {"x": 4}],
    7,
]


def test_the_running_torch_is_in_the_supported_range():
    assert SUPPORTED_TORCH[0] <= _torch_compat.TORCH_VERSION <= SUPPORTED_TORCH[1]


def test_every_private_api_named_there_exists_on_this_torch():
    """What the engine calls through the module, looked up here (the calls themselves run in tests/engine)."""
    cpu_vec_isa = pytest.importorskip("torch._inductor.cpu_vec_isa")
    import torch._inductor as inductor

    assert callable(inductor.aot_compile) and callable(inductor.standalone_compile)
    assert callable(inductor.CompiledArtifact.load)
    assert callable(torch._C._aoti.AOTIModelContainerRunnerCpu)
    assert callable(cpu_vec_isa.VecISA.check_build) and callable(cpu_vec_isa.x86_isa_checker)
    assert isinstance(_torch_compat.inductor_force_stride_order(), _torch_compat.OpOverload)
    for name in ("all_reduce", "broadcast", "wait_tensor"):
        assert isinstance(getattr(_torch_compat.c10d_functional, name).default, _torch_compat.OpOverload), name
    assert torch.Tensor.add.__objclass__ is _torch_compat.TensorBase
    assert callable(getattr(torch.optim.Optimizer.zero_grad, "__wrapped__", None)), "dynamo wrapper changed"


def test_the_proxy_node_is_the_node_make_fx_records():
    nodes = []

    def step(x):
        y = x * 2
        nodes.append(_torch_compat.proxy_node(y))
        return y + 1

    gm = _torch_compat.make_fx(step, tracing_mode="fake")(torch.ones(3))
    assert nodes and nodes[0] in gm.graph.nodes and nodes[0].target is torch.ops.aten.mul.Tensor


@pytest.mark.parametrize("step, data_dependent", [
    (lambda x: x * 2 if x.sum() > 0 else x, True),  # a Python branch on a value: torch's guard error
    (lambda x: x * 2, False),
])
def test_data_dependent_errors_are_recognised(step, data_dependent):
    try:
        _torch_compat.make_fx(step, tracing_mode="fake")(torch.tensor([1.0, -1.0, 2.0]))
    except Exception as exc:  # noqa: BLE001 - whichever error this torch raises for it
        assert data_dependent and _torch_compat.is_data_dependent_error(exc), repr(exc)
    else:
        assert not data_dependent


@pytest.mark.parametrize("error, data_dependent", [
    (_torch_compat.DynamicOutputShapeException(torch.ops.aten.nonzero.default), True),
    (_torch_compat.DataDependentOutputException(torch.ops.aten._local_scalar_dense.default), True),
    (RuntimeError("shape mismatch"), False),
    (ValueError("GuardOnDataDependentSymNode"), False),  # the name of the type counts, not the text
])
def test_data_dependent_error_types(error, data_dependent):
    assert _torch_compat.is_data_dependent_error(error) is data_dependent


@pytest.mark.parametrize("tree", _TREES, ids=["nested", "odict", "list", "leaf"])
def test_hand_written_treespec_json_is_what_torch_serializes(tree):
    def node(obj):
        if isinstance(obj, dict):
            name = "collections.OrderedDict" if isinstance(obj, collections.OrderedDict) else "builtins.dict"
            return _torch_compat.treespec_json_node(name, json.dumps(list(obj)), [node(v) for v in obj.values()])
        if type(obj) in (list, tuple):
            return _torch_compat.treespec_json_node(f"builtins.{type(obj).__name__}", "null", [node(v) for v in obj])
        return _torch_compat.treespec_json_leaf()

    text = json.dumps([_torch_compat.TREESPEC_PROTOCOL, node(tree)])
    assert json.loads(torch_pytree.treespec_dumps(torch_pytree.tree_structure(tree))) == json.loads(text)
    assert torch_pytree.treespec_loads(text) == torch_pytree.tree_structure(tree)


def _pytree_globals(data: bytes) -> set[tuple[str, str]]:
    """The (module, name) pairs a pickle loads from torch.utils._pytree (GLOBAL and STACK_GLOBAL)."""
    found, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "GLOBAL":
            found.add(tuple(arg.split(" ", 1)))
        elif op.name == "STACK_GLOBAL":
            found.add((strings[-2], strings[-1]))
    return {pair for pair in found if pair[0] == "torch.utils._pytree"}


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_every_name_torch_pickles_a_treespec_under_is_listed(protocol):
    """The legacy checkpoint reader's allowlist comes from these lists (checkpoint/legacy.py)."""
    listed = set(_torch_compat.PYTREE_PICKLED_NODES) | set(_torch_compat.PYTREE_PICKLED_LEAVES)
    for tree in _TREES:
        used = _pytree_globals(pickle.dumps(torch_pytree.tree_structure(tree), protocol=protocol))
        assert used and used <= listed, used - listed


def test_a_degraded_feature_is_one_warning_naming_it(caplog):
    with caplog.at_level(logging.WARNING, logger="cs_run"):
        for _ in range(3):
            _torch_compat.warn_degraded("the test feature (torch._nothing)", "no such module", "cs-run does X instead")
    records = [r.getMessage() for r in caplog.records if "the test feature" in r.getMessage()]
    assert records == [f"torch {torch.__version__}: the test feature (torch._nothing) is not available "
                       "(no such module); cs-run does X instead"]


def test_a_torch_without_the_isa_probe_hook_runs_unpatched_and_says_so(monkeypatch, caplog):
    cpu_vec_isa = pytest.importorskip("torch._inductor.cpu_vec_isa")
    monkeypatch.delattr(cpu_vec_isa.VecISA, "check_build")
    monkeypatch.setattr(_torch_compat, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="cs_run"):
        with _torch_compat.patched_isa_check_build(lambda original: pytest.fail("nothing to wrap")) as patched:
            assert patched is False
    assert [r.getMessage() for r in caplog.records if "VecISA.check_build" in r.getMessage()] == [
        f"torch {torch.__version__}: inductor's CPU-ISA probe cache (torch._inductor.cpu_vec_isa.VecISA.check_build) "
        "is not available (no such method); every compile probes the CPU's vector ISAs again"]


def test_the_isa_probe_hook_is_restored_after_the_block():
    cpu_vec_isa = pytest.importorskip("torch._inductor.cpu_vec_isa")
    original = cpu_vec_isa.VecISA.check_build
    with pytest.raises(KeyError):
        with _torch_compat.patched_isa_check_build(lambda f: lambda isa, code: f(isa, code)) as patched:
            assert patched is True and cpu_vec_isa.VecISA.check_build is not original
            raise KeyError("the block fails")
    assert cpu_vec_isa.VecISA.check_build is original


# -- inductor's loop reordering after fusion before torch 2.13 (inductor_build_fixes) ----------------------
def _fused_node(*snodes):
    """What ``FusedSchedulerNode.reorder_loops_by_dep_pair`` reads of its node: the fused nodes, not a template."""
    return types.SimpleNamespace(snodes=list(snodes), is_template=lambda: False)


def test_a_fused_node_holding_a_foreign_node_is_not_reordered_as_torch_2_13_decides():
    scheduler = pytest.importorskip("torch._inductor.scheduler")
    original = scheduler.FusedSchedulerNode.reorder_loops_by_dep_pair
    foreign = _fused_node(object(), object.__new__(scheduler.SchedulerNode))  # object(): e.g. an extern kernel's node
    if _torch_compat.TORCH_VERSION >= (2, 13):
        assert original(foreign, None, None) is False  # the reference: torch's own answer from 2.13 on
    else:
        with pytest.raises(AssertionError):  # the bug the fix works around
            original(foreign, None, None)
    assert _torch_compat.foreign_nodes_not_reordered(original)(foreign, None, None) is False


def test_a_fused_node_of_scheduler_nodes_is_reordered_by_torch():
    scheduler = pytest.importorskip("torch._inductor.scheduler")
    own = _fused_node(object.__new__(scheduler.SchedulerNode), object.__new__(scheduler.SchedulerNode))
    calls = []
    fixed = _torch_compat.foreign_nodes_not_reordered(lambda node, a, b: calls.append((node, a, b)) or True)
    assert fixed(own, "dep1", "dep2") is True and calls == [(own, "dep1", "dep2")]


@pytest.mark.parametrize("version, patched", [((2, 11), True), ((2, 12), True), ((2, 13), False), ((2, 15), False)])
def test_the_reordering_fix_applies_before_2_13_during_the_build_only(monkeypatch, version, patched):
    scheduler = pytest.importorskip("torch._inductor.scheduler")
    original = scheduler.FusedSchedulerNode.reorder_loops_by_dep_pair
    monkeypatch.setattr(_torch_compat, "TORCH_VERSION", version)
    with _torch_compat.inductor_build_fixes():
        inside = scheduler.FusedSchedulerNode.reorder_loops_by_dep_pair
        assert (inside is not original) is patched
        assert not patched or inside.__wrapped__ is original
    assert scheduler.FusedSchedulerNode.reorder_loops_by_dep_pair is original


def _raise_in_reordering():
    def reorder_loops_by_dep_pair():  # named as the scheduler's method, so the traceback shows it
        raise AssertionError

    try:
        reorder_loops_by_dep_pair()
    except AssertionError as exc:
        raise RuntimeError("inductor wraps what its scheduler raised") from exc


def test_a_build_failing_in_the_loop_reordering_is_built_again_without_it(monkeypatch, caplog):
    config = pytest.importorskip("torch._inductor.config")
    monkeypatch.setattr(_torch_compat, "_WARNED", set())
    before, seen = config.loop_ordering_after_fusion, []

    def build():
        seen.append(config.loop_ordering_after_fusion)
        if len(seen) == 1:
            _raise_in_reordering()
        return "artifact"

    with caplog.at_level(logging.WARNING, logger="cs_run"):
        assert _torch_compat.without_loop_reordering_if_it_fails(build) == "artifact"
    assert seen == [before, False] and config.loop_ordering_after_fusion == before
    assert [r.getMessage() for r in caplog.records if "loop reordering" in r.getMessage()] == [
        f"torch {torch.__version__}: inductor's loop reordering after fusion "
        "(torch._inductor.config.loop_ordering_after_fusion) is not available (RuntimeError inside it); "
        "this step builds without it"]


def test_a_build_failing_elsewhere_fails_once_without_a_second_build():
    calls = []

    def build():
        calls.append(1)
        raise ValueError("a lowering error")

    with pytest.raises(ValueError, match="a lowering error"):
        _torch_compat.without_loop_reordering_if_it_fails(build)
    assert calls == [1] and not _torch_compat.raised_in_loop_reordering(ValueError())
