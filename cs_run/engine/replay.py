"""Replay a compiled step on the next batch (DESIGN §4.5–4.6).

No user Python runs here. The compiled graph mutates the real state tensors in place; slots the step
*rebound* get the new value copied in (identity kept), gradients left by the step are attached to
the parameters, and closures recorded in the trace run afterwards on cloned values.

There is no host-device synchronisation in this function: on CUDA everything is queued on the
current stream and the only syncs are the ones a closure asks for (``loss.item()``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from cs_run.engine.trace import OutputRef, TracedStep

__all__ = ["replay", "batch_leaves"]


def batch_leaves(traced: TracedStep, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensor leaves of a batch, in the order the graph takes them."""
    leaves = pytree.tree_leaves((args, kwargs))
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def replay(executable: Callable[..., Any], traced: TracedStep, batch: list[torch.Tensor]) -> Any:
    """Runs one step: the graph, then rebinds, grads and closures; returns the user's output."""
    slots = traced.state.slots
    with torch.no_grad():  # the graph is aten-level: autograd would only add overhead
        outs = executable(*traced.state.tensors, *batch)
        n = traced.num_user_outputs
        for k, idx in enumerate(traced.rebind_slots, start=n):
            slots[idx].tensor.copy_(outs[k])
        first_grad = n + len(traced.rebind_slots)
        for k, idx in enumerate(traced.grad_slots, start=first_grad):
            slots[idx].tensor.grad = outs[k]
    leaves = [outs[x.index] if isinstance(x, OutputRef) else x for x in traced.out_leaves]
    result = pytree.tree_unflatten(leaves, traced.out_spec)
    for call in traced.closure_calls:  # after the step, on this step's cloned values
        call.run(outs)
    return result
