"""Every private torch API cs-run uses, in one place, with the differences between the torch versions it
supports (``_version_check.SUPPORTED_TORCH``: 2.11 through 2.15).

torch keeps no promise about these names (``torch._inductor``, ``torch._C._aoti``, make_fx's proxy
slots, fake tensors, ``torch.ops._c10d_functional``, ``torch.utils._pytree`` and the forms it pickles
and serializes), so the rest of cs-run reaches them only through here: a change in a new torch is one
edit in this file, and ``make test-torch-2.14`` runs the engine on a second version. Where a private
API is missing, the feature built on it degrades loudly: :func:`warn_degraded` logs one warning
naming the feature and what cs-run does instead, never a silent change of behaviour.

A leaf module: torch only. The heavy inductor modules load inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import sys
import traceback
import unittest.mock
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensor
from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot, make_fx

__all__ = [
    "PYTREE_PICKLED_LEAVES", "PYTREE_PICKLED_NODES", "TORCH_VERSION", "TREESPEC_PROTOCOL",
    "DataDependentOutputException", "DynamicOutputShapeException", "FakeTensor", "OpOverload", "TensorBase",
    "aot_compile", "aoti_cpu_runner", "c10d_functional", "cpu_isa_flags", "foreign_nodes_not_reordered",
    "inductor_build_fixes", "inductor_force_stride_order", "is_data_dependent_error", "load_compiled_artifact",
    "make_fx", "patched_isa_check_build", "proxy_node", "pytree", "raised_in_loop_reordering",
    "save_compiled_artifact", "shut_down_loader_workers", "standalone_compile", "treespec_json_leaf", "treespec_json_node", "warn_degraded",
    "without_dynamo_wrapper", "without_loop_reordering_if_it_fails",
]

logger = logging.getLogger(__name__)

TORCH_VERSION: tuple[int, int] = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])  # type: ignore[assignment]

# -- degrading loudly ------------------------------------------------------------------------------
_WARNED: set[str] = set()


def warn_degraded(feature: str, reason: object, instead: str) -> None:
    """Logs once per process that ``feature`` is unavailable on this torch (``reason``) and what runs ``instead``."""
    if feature in _WARNED:
        return
    _WARNED.add(feature)
    logger.warning("torch %s: %s is not available (%s); %s", torch.__version__, feature, reason, instead)


# -- tracing: make_fx, its proxy slots, fake tensors (torch.fx.experimental.proxy_tensor, torch._subclasses)
TensorBase = torch._C.TensorBase  # what Tensor's C methods report as their __objclass__
OpOverload = torch._ops.OpOverload

# The data-dependent failures of a fake-tensor trace; GuardOnDataDependentSymNode (symbolic shapes) is
# matched by name: its module moved between releases and only the name is needed.
_DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "DataDependentOutputException", "DynamicOutputShapeException")


def is_data_dependent_error(exc: BaseException) -> bool:
    """True when ``exc`` is make_fx refusing a value-dependent op (a host read or a value-dependent shape)."""
    return (isinstance(exc, (DataDependentOutputException, DynamicOutputShapeException))
            or type(exc).__name__ in _DATA_DEPENDENT)


def proxy_node(t: torch.Tensor) -> torch.fx.Node:
    """The graph node make_fx recorded for ``t`` (called inside the trace, where its proxy mode is active)."""
    return get_proxy_slot(t, get_proxy_mode().tracer).proxy.node


def without_dynamo_wrapper(method: Callable[..., Any]) -> Callable[..., Any]:
    """torch's Optimizer method without its ``torch._disable_dynamo`` wrapper while dynamo is not loaded.

    That wrapper's first call imports ``torch._dynamo`` (and with it ``torch._inductor``: seconds on a
    slow host) only to mark the method as not traceable by dynamo. While dynamo is not loaded nothing
    can be tracing, so the plain method (its ``__wrapped__``) is the same call; once it is loaded,
    torch's wrapper is used.
    """
    plain = getattr(method, "__wrapped__", method)

    @functools.wraps(plain)
    def call(*args: Any, **kwargs: Any) -> Any:
        return (method if "torch._dynamo" in sys.modules else plain)(*args, **kwargs)

    return call


# -- the pytree forms cs-run reads and writes without torch's help ----------------------------------
# How a pickled TreeSpec names its classes: a node is a TreeSpec; a leaf was a LeafSpec instance up to
# torch 2.13, and from 2.14 on (LeafSpec deprecated) a call of the module function treespec_leaf().
PYTREE_PICKLED_NODES = (("torch.utils._pytree", "TreeSpec"),)
PYTREE_PICKLED_LEAVES = (("torch.utils._pytree", "LeafSpec"), ("torch.utils._pytree", "treespec_leaf"))

# treespec_dumps' JSON (the vendor's format-0.5 __spec__): protocol 1 from torch 2.1 through 2.15.
TREESPEC_PROTOCOL = 1


def treespec_json_leaf() -> dict:
    """A leaf of ``treespec_dumps``' protocol-1 JSON."""
    return {"type": None, "context": None, "children_spec": []}


def treespec_json_node(type_name: str, context: str, children: list[dict]) -> dict:
    """A container node of that JSON: ``type_name`` is the registered name (``builtins.dict``), ``context``
    its context already JSON-encoded (the dict's keys; ``"null"`` for a list or tuple)."""
    return {"type": type_name, "context": context, "children_spec": children}


# -- collectives inside the traced step (torch.ops._c10d_functional) --------------------------------
c10d_functional = torch.ops._c10d_functional  # all_reduce, broadcast, wait_tensor (resolved on first use)


# -- inductor (torch._inductor, AOTInductor's runner in torch._C._aoti) ------------------------------
def aot_compile(gm: torch.fx.GraphModule, inputs: tuple, output_path: Path) -> Path:
    """AOTInductor: ``gm`` compiled for ``inputs`` into the shared library ``output_path``; returns its path."""
    from torch._inductor import aot_compile as _aot_compile  # noqa: PLC0415, TID253  (heavy)

    with warnings.catch_warnings():  # torch's own LeafSpec deprecation (2.13 on), raised inside its lowering
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        return Path(str(_aot_compile(gm, inputs, options={"aot_inductor.output_path": str(output_path)})))


def aoti_cpu_runner(path: Path) -> Any:
    """AOTInductor's C++ runner of a CPU step library (a ``dlopen``; no inductor import); ``.run(list)``."""
    return torch._C._aoti.AOTIModelContainerRunnerCpu(str(path), 1)


def standalone_compile(gm: torch.fx.GraphModule, example: list[torch.Tensor]) -> Any:
    """inductor's compile of ``gm`` with its Python wrapper: a ``CompiledArtifact`` (callable, ``is_saveable``, ``save``)."""
    from torch._inductor import standalone_compile as _standalone_compile  # noqa: PLC0415, TID253  (heavy)

    def build() -> Any:
        return _standalone_compile(gm, example, dynamic_shapes="from_example_inputs")

    return build() if TORCH_VERSION >= (2, 13) else without_loop_reordering_if_it_fails(build)


# The scheduler's loop reordering after fusion (GPU kernels only: inductor skips it for CPU nodes).
_LOOP_REORDERING = ("reorder_loops_by_dep_pair", "shared_data_after_reordering_loop", "apply_new_loop_order",
                    "decide_loop_order_to_match")
_LOOP_REORDERING_FEATURE = "inductor's loop reordering after fusion (torch._inductor.config.loop_ordering_after_fusion)"


def inductor_build_fixes() -> contextlib.AbstractContextManager:
    """Inductor settings around every build that work around a known bug of the running torch.

    Before torch 2.13, ``FusedSchedulerNode.reorder_loops_by_dep_pair`` asserts that every node it fused
    is a ``SchedulerNode``, and a whole training step of a transformer (GPT-2 on CUDA, torch 2.11) holds
    fused nodes that are not: the step did not compile at all. 2.13 answers "not reordered" (False) for
    such a node; those versions get that answer here, during the build only, and keep the reordering
    everywhere else, as their ``torch.compile`` does (turning it off wholesale cost fusions it finds).
    """
    if TORCH_VERSION >= (2, 13):
        return contextlib.nullcontext()
    from torch._inductor.scheduler import FusedSchedulerNode  # noqa: PLC0415, TID253  (heavy)

    return unittest.mock.patch.object(FusedSchedulerNode, "reorder_loops_by_dep_pair",
                                      foreign_nodes_not_reordered(FusedSchedulerNode.reorder_loops_by_dep_pair))


def foreign_nodes_not_reordered(reorder: Callable[..., bool]) -> Callable[..., bool]:
    """``FusedSchedulerNode.reorder_loops_by_dep_pair`` as torch 2.13 has it: False when one of the fused
    nodes is not a ``SchedulerNode``, the original ``reorder`` otherwise."""
    from torch._inductor.scheduler import SchedulerNode  # noqa: PLC0415, TID253  (heavy)

    @functools.wraps(reorder)
    def reorder_own_nodes(self: Any, self_dep: Any, other_dep: Any) -> bool:
        if not all(isinstance(snode, SchedulerNode) for snode in self.snodes):
            return False
        return reorder(self, self_dep, other_dep)

    return reorder_own_nodes


def raised_in_loop_reordering(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from (inductor wraps them), came out of the
    scheduler's loop reordering."""
    seen: BaseException | None = exc
    while seen is not None:
        if any(frame.name in _LOOP_REORDERING for frame in traceback.extract_tb(seen.__traceback__)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def without_loop_reordering_if_it_fails(build: Callable[[], Any]) -> Any:
    """``build()``; when that fails inside the loop reordering (a case :func:`inductor_build_fixes` does not
    cover), one warning naming the feature, and ``build()`` again without the reordering."""
    import torch._inductor.config as inductor_config  # noqa: PLC0415, TID253  (heavy)

    try:
        return build()
    except Exception as exc:
        if not raised_in_loop_reordering(exc):
            raise
        warn_degraded(_LOOP_REORDERING_FEATURE, f"{type(exc).__name__} inside it", "this step builds without it")
    with inductor_config.patch(loop_ordering_after_fusion=False):
        return build()


def load_compiled_artifact(path: Path) -> Any:
    """A ``CompiledArtifact`` saved by ``artifact.save(path=..., format="binary")``."""
    from torch._inductor import CompiledArtifact  # noqa: PLC0415, TID253  (heavy)

    return CompiledArtifact.load(path=str(path), format="binary")


def save_compiled_artifact(artifact: Any, path: Path) -> None:
    """Writes a ``CompiledArtifact`` where :func:`load_compiled_artifact` reads it."""
    artifact.save(path=str(path), format="binary")


def inductor_force_stride_order() -> Any:
    """inductor's ``prims.inductor_force_stride_order`` op (importing inductor_prims registers it)."""
    from torch._inductor import inductor_prims  # noqa: F401, PLC0415, TID253  (heavy; registers the prim)

    return torch.ops.prims.inductor_force_stride_order.default


_ISA_PROBE = "inductor's CPU-ISA probe cache (torch._inductor.cpu_vec_isa.VecISA.check_build)"


def cpu_isa_flags() -> list[str]:
    """The CPU flags inductor's x86 ISA checker reads (empty off x86); part of the probe cache's host key."""
    from torch._inductor import cpu_vec_isa  # noqa: PLC0415, TID253  (heavy)

    checker = getattr(cpu_vec_isa, "x86_isa_checker", None)
    return sorted(checker()) if checker is not None else []


@contextlib.contextmanager
def patched_isa_check_build(wrap: Callable[[Callable[[Any, str], bool]], Callable[[Any, str], bool]]) -> Iterator[bool]:
    """During the block, inductor's CPU-ISA probe ``VecISA.check_build(isa, code)`` is ``wrap(original)``.

    Yields whether it was patched: on a torch without that method the probes run as usual and
    :func:`warn_degraded` says so (each probe is a dry compile plus a child Python, about a second).
    """
    from torch._inductor import cpu_vec_isa  # noqa: PLC0415, TID253  (heavy)

    vec_isa = getattr(cpu_vec_isa, "VecISA", None)
    original = getattr(vec_isa, "check_build", None)
    if original is None:
        warn_degraded(_ISA_PROBE, "no such method", "every compile probes the CPU's vector ISAs again")
        yield False
        return
    vec_isa.check_build = wrap(original)
    try:
        yield True
    finally:
        vec_isa.check_build = original


# -- DataLoader --------------------------------------------------------------------------------------
def shut_down_loader_workers(loader: Any) -> None:
    """End the worker processes a ``torch.utils.data.DataLoader`` with ``persistent_workers`` keeps between
    passes (its ``_iterator``), now, instead of whenever the garbage collector frees the loader: a finished
    run's workers otherwise outlive it, and their shutdown can fall inside a later run (each worker joined
    for up to 5 s, from wherever the collector ran). The loader stays usable: its next pass starts new
    workers. Anything else, or a torch without that attribute, is left as it is."""
    iterator = getattr(loader, "_iterator", None)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is None:
        return
    shutdown()
    loader._iterator = None
