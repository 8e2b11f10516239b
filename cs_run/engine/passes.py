"""Graph rewrites for the inductor tier, applied to a copy of the traced step before lowering
(docs/architecture.md#graph-passes-for-the-inductor-tier).

The traced aten graph (mutating, not functionalized: inductor functionalizes it) is rewritten into a
graph that computes the same float operations in the same order, but that inductor's CPU backend
lowers into less work. The fx tier never sees them (it runs the traced graph itself, bit-identical to
eager).

* ``unfuse_bias_addmm`` — ``addmm(bias, x, w)`` whose result only feeds elementwise ops (through views)
  becomes ``view(mm(x, w)) + bias``. ATen's addmm first broadcasts the bias into the output and the GEMM
  reads it back (beta = 1); the add instead fuses into the elementwise kernel that reads the result
  anyway (inductor does this rewrite on GPUs only). GEMM then add is what beta = 1 computes too.
* ``share_gelu_erf`` — a training step computes ``erf(x / sqrt(2))`` twice per exact GELU: in the
  forward and again in ``gelu_backward`` of the same ``x``. Inductor lowers both from the same
  decomposition, so the term is written out once (forward kernel) and read by the backward kernel
  instead of recomputing the erf polynomial; the arithmetic is inductor's own decomposition.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch
from torch.fx import Graph, GraphModule, Node

from cs_run._torch_compat import OpOverload, inductor_force_stride_order

__all__ = ["PASSES", "run_passes", "scale_before_add", "share_gelu_erf", "unfuse_bias_addmm"]

logger = logging.getLogger(__name__)
aten = torch.ops.aten

# Ops that only reinterpret their input's memory: a use through them is a use of the original value.
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
          aten.squeeze.dim, aten.expand.default}


def _val(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _is_pointwise(node: Node) -> bool:
    target = node.target
    return (node.op == "call_function" and isinstance(target, OpOverload)
            and torch.Tag.pointwise in target.tags and not target._schema.is_mutable)


def _elementwise_views(node: Node) -> list[Node] | None:
    """The view nodes through which ``node`` is used, when every use is a view whose every use is a
    non-mutating pointwise op; else None."""
    views = list(node.users)
    if not views or any(v.op != "call_function" or v.target not in _VIEWS for v in views):
        return None
    if any(not v.users or not all(_is_pointwise(u) for u in v.users) for v in views):
        return None
    return views


def _call(graph: Graph, target: object, args: tuple, like: Node) -> Node:
    """A new node computing ``target(*args)``; it carries ``like``'s value metadata (same shape/dtype)."""
    node = graph.call_function(target, args)
    if "val" in like.meta:
        node.meta["val"] = like.meta["val"]
    return node


def unfuse_bias_addmm(gm: GraphModule) -> int:
    """Rewrites ``view(addmm(bias, x, w))`` (beta = alpha = 1, float, a 1-D bias along the rows) whose
    views feed only elementwise ops into ``view(mm(x, w)) + bias``; returns how many it rewrote.

    The add goes after the view: inductor turns ``mm(x, w) + bias`` written directly back into addmm.
    """
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.addmm.default or len(node.args) != 3:
            continue
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            continue
        bias, out = _val(node.args[0]), _val(node)
        if bias is None or out is None or not out.dtype.is_floating_point or bias.dtype != out.dtype:
            continue
        if bias.dim() != 1 or out.dim() != 2 or bias.shape[0] != out.shape[1]:
            continue
        views = _elementwise_views(node)
        if views is None or any(_val(v) is None or _val(v).shape[-1] != bias.shape[0] for v in views):
            continue
        with gm.graph.inserting_before(node):
            mm = _call(gm.graph, aten.mm.default, (node.args[1], node.args[2]), node)
        node.replace_all_uses_with(mm)
        for view in views:
            with gm.graph.inserting_after(view):
                add = _call(gm.graph, aten.add.Tensor, (view, node.args[0]), view)
            view.replace_all_uses_with(add, delete_user_cb=lambda user, add=add: user is not add)
        gm.graph.erase_node(node)
        count += 1
    return count


# The constants of inductor's (torch._decomp) exact-GELU decomposition, in its order of operations.
_SQRT1_2 = 0.70710678118654752440
_PDF_SCALE = 1.12837916709551257390 * _SQRT1_2 * 0.5  # 1 / sqrt(2 pi)


def _exact_gelu(node: Node) -> bool:
    return node.op == "call_function" and node.kwargs.get("approximate", "none") == "none" and (
        (node.target is aten.gelu.default and len(node.args) == 1)
        or (node.target is aten.gelu_backward.default and len(node.args) == 2))


def _dense_strides(val: torch.Tensor) -> list[int]:
    """The strides an elementwise op's output of ``val`` gets: ``val``'s own when it is dense, else
    contiguous ones in its stride order (``empty_like``'s rule)."""
    probe = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device="meta")
    return list(torch.empty_like(probe).stride())


def share_gelu_erf(gm: GraphModule) -> int:
    """Rewrites each exact ``gelu(x)`` that has a ``gelu_backward(g, x)`` of the same ``x`` into the
    decomposition with one shared, materialized ``erf(x / sqrt(2))``; returns how many it rewrote."""
    materialize = inductor_force_stride_order()
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if node.target is not aten.gelu.default or not _exact_gelu(node):
            continue
        x = node.args[0]
        val = _val(x)
        backwards = [u for u in x.users if u.target is aten.gelu_backward.default and _exact_gelu(u)
                     and u.args[1] is x]
        if val is None or not val.dtype.is_floating_point or not backwards:
            continue
        with graph.inserting_before(node):  # gelu(x) = x * 0.5 * (1 + erf(x * sqrt(1/2)))
            erf = _call(graph, aten.erf.default, (_call(graph, aten.mul.Tensor, (x, _SQRT1_2), x),), x)
            erf = _call(graph, materialize, (erf, _dense_strides(val)), x)
            half_x = _call(graph, aten.mul.Tensor, (x, 0.5), x)
            gelu = _call(graph, aten.mul.Tensor, (half_x, _call(graph, aten.add.Tensor, (erf, 1), x)), node)
        node.replace_all_uses_with(gelu)
        graph.erase_node(node)
        for backward in backwards:  # grad * (0.5 * (1 + erf) + x * (exp(x * x * -0.5) / sqrt(2 pi)))
            grad = backward.args[0]
            with graph.inserting_before(backward):
                cdf = _call(graph, aten.mul.Tensor, (_call(graph, aten.add.Tensor, (erf, 1), x), 0.5), x)
                square = _call(graph, aten.mul.Tensor, (x, x), x)
                exp = _call(graph, aten.exp.default, (_call(graph, aten.mul.Tensor, (square, -0.5), x),), x)
                pdf = _call(graph, aten.mul.Tensor, (exp, _PDF_SCALE), x)
                slope = _call(graph, aten.add.Tensor, (cdf, _call(graph, aten.mul.Tensor, (x, pdf), x)), x)
                result = _call(graph, aten.mul.Tensor, (grad, slope), backward)
            backward.replace_all_uses_with(result)
            graph.erase_node(backward)
        count += 1
    return count


# Ops that only re-index their one tensor input: an mm seen through them is still the mm.
_INDEXING = _VIEWS | {aten.t.default, aten.transpose.int, aten.permute.default, aten.alias.default}


def _from_mm(node: object) -> bool:
    while isinstance(node, Node) and node.op == "call_function" and node.target in _INDEXING:
        node = node.args[0]
    return isinstance(node, Node) and node.target is aten.mm.default


def scale_before_add(gm: GraphModule) -> int:
    """Rewrites ``add(x, y, alpha=a)`` (and ``add_``) with an ``mm`` on either side and ``a != 1`` into
    ``add(x, mul(y, a))``; returns how many it rewrote.

    A correctness workaround, for every device: inductor's post-grad pattern that folds ``add(inp, mm)``
    into ``addmm(inp, ...)`` does not look at ``alpha`` and drops it (torch 2.13: ``p.add(a @ b,
    alpha=-0.1)`` under ``torch.compile`` returns ``p + a @ b``), so a plain SGD step, ``p.add_(grad,
    alpha=-lr)`` of a weight whose gradient is an mm, applied the whole gradient. ``mul`` then ``add`` is
    how inductor lowers an alpha on the CPU (on CUDA it uses one fma: a rounding apart). Not one of
    :data:`PASSES` (CPU speed-ups): the engine applies it to every inductor build (``compile._rewritten``)."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (aten.add.Tensor, aten.add_.Tensor):
            continue
        alpha = node.kwargs.get("alpha", 1)
        x, y = node.args[:2]
        if alpha == 1 or len(node.args) != 2 or not (_from_mm(x) or _from_mm(y)) or _val(y) is None:
            continue
        with gm.graph.inserting_before(node):
            scaled = _call(gm.graph, aten.mul.Tensor, (y, alpha), y)
            add = _call(gm.graph, node.target, (x, scaled), node)
        node.replace_all_uses_with(add)
        gm.graph.erase_node(node)
        count += 1
    return count


# name -> pass, in the order they run; each returns how many places it rewrote.
PASSES: dict[str, Callable[[GraphModule], int]] = {"unfuse_bias_addmm": unfuse_bias_addmm,
                                                   "share_gelu_erf": share_gelu_erf}


def run_passes(gm: GraphModule, passes: dict[str, Callable[[GraphModule], int]] | None = None,
               ) -> tuple[GraphModule, dict[str, int]]:
    """A rewritten copy of ``gm`` (``gm`` itself is untouched: the fx tier runs it) and how many places
    each pass of ``passes`` (default: all) rewrote. Graphs with values off the CPU are left as they are
    (the rewrites are for inductor's CPU backend; on GPUs inductor unfuses addmm itself)."""
    passes = PASSES if passes is None else passes
    graph = Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    copy = GraphModule(gm, graph)
    vals = [_val(n) for n in copy.graph.nodes]
    if any(v is not None and v.device.type != "cpu" for v in vals):
        return copy, dict.fromkeys(passes, 0)
    counts = {name: rewrite(copy) for name, rewrite in passes.items()}
    if any(counts.values()):
        copy.graph.lint()
        copy.recompile()
    logger.debug("graph passes for the inductor tier: %s", counts)
    return copy, counts
