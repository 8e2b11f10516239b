"""``cs_run.parallel``: how the replicas share a run, behind one :class:`Strategy`
(docs/architecture.md#parallelism). ``runconfig.sharding`` picks it: ``none`` (data parallel) or
``fsdp`` (torch FSDP2); ``runconfig.offload: cpu`` keeps the sharded state in host memory. Both are
checked once, into a :class:`Layout` (:func:`resolve_layout`), that :func:`build_strategy` builds from.

The runner makes the run's strategy and makes it :func:`current`, so code that is not handed one
(``cstorch.save``) asks the same strategy; without a run it is data parallel.

The layout (its choices, its check) is torch-free and imported here; the strategies load on first use
(module ``__getattr__``), so the params and ``cs-run --help`` read the choices without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cs_run.parallel.layout import CLI_WORDS, DATA_PARALLEL, Layout, Offload, Sharding, Words, resolve_layout

if TYPE_CHECKING:
    from cs_run.parallel.fsdp import FullyShardedStrategy
    from cs_run.parallel.run_strategy import build_strategy, current, use
    from cs_run.parallel.strategy import Strategy

__all__ = ["CLI_WORDS", "DATA_PARALLEL", "FullyShardedStrategy", "Layout", "Offload", "Sharding", "Strategy", "Words",
           "build_strategy", "current", "resolve_layout", "use"]

_LAZY = {"Strategy": "cs_run.parallel.strategy", "FullyShardedStrategy": "cs_run.parallel.fsdp",
         "build_strategy": "cs_run.parallel.run_strategy", "current": "cs_run.parallel.run_strategy",
         "use": "cs_run.parallel.run_strategy"}
"""The names that need torch, by the module that holds them: loaded when first asked for."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
