"""Replay a compiled step on the next batch (docs/architecture.md#the-csx-engine-cs_runengine).

No user Python runs here. The compiled graph mutates the real state tensors in place; slots the step
*rebound* get the new value copied in (identity kept), gradients left by the step are attached to
the parameters, and closures recorded in the trace run afterwards on cloned values.

There is no host-device synchronisation in this function: on CUDA everything is queued on the
current stream and the only syncs are the ones a closure asks for (``loss.item()``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from cs_run._torch_compat import pytree
from cs_run.engine.trace import OutputRef, TracedStep

__all__ = ["replay"]


def replay(executable: Callable[..., Any], traced: TracedStep, batch: list[torch.Tensor]) -> Any:
    """Runs one step: the graph, then rebinds, grads and closures; returns the user's output."""
    slots, layout = traced.state.slots, traced.layout
    with torch.no_grad():  # the graph is aten-level: autograd would only add overhead
        outs = executable(*traced.state.tensors, *batch)
        for k, idx in zip(layout.rebinds, layout.rebind_slots):
            slots[idx].tensor.copy_(outs[k])
        for k, idx in zip(layout.grads, layout.grad_slots):
            slots[idx].tensor.grad = outs[k]
    leaves = [outs[x.index] if isinstance(x, OutputRef) else x for x in traced.out_leaves]
    result = pytree.tree_unflatten(leaves, traced.out_spec)
    values = outs[layout.closure_values.start:layout.closure_values.stop]
    for call in traced.closure_calls:  # after the step, on this step's cloned values
        call.run(values)
    return result
