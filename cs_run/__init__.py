"""cs-run: the Cerebras PyTorch programming model on plain PyTorch.

Use it as ``import cs_run as cstorch``. Public names are re-exported here explicitly; anything not
re-exported is internal. They load on first use (module ``__getattr__``), so ``import cs_run`` and
``cs-run --help`` do not pay for importing torch; heavy optional dependencies (h5py, inductor,
tensorboard, matplotlib, safetensors) load where they are used. docs/architecture.md describes the layers.
"""

import importlib
import importlib.util
import sys
import types

from cs_run import (  # before anything else; neither imports torch
    _launcher_watch,  # noqa: F401  a replica (torch's elastic agent started it) ends with its launcher
    _version_check,  # a clear error on a torch this code was not run with
)

__version__ = "0.1.0"

_SUBMODULES = ("amp", "distributed", "errors", "experimental", "metrics", "optim", "runners", "sparse", "utils")
_NAMES = {
    "Backend": "cs_run.backend",
    "backend": "cs_run.backend",
    "configure": "cs_run.backend",
    "current_backend": "cs_run.backend",
    "current_torch_device": "cs_run.backend",
    "use_cs": "cs_run.backend",
    "load": "cs_run.checkpoint",
    "save": "cs_run.saving",
    "from_numpy": "cs_run.creation",
    "full": "cs_run.creation",
    "full_like": "cs_run.creation",
    "manual_seed": "cs_run.creation",
    "ones": "cs_run.creation",
    "ones_like": "cs_run.creation",
    "to_numpy": "cs_run.creation",
    "zeros": "cs_run.creation",
    "zeros_like": "cs_run.creation",
    "run": "cs_run.frontends.modelzoo",
    "checkpoint_closure": "cs_run.tracing",
    "compile": "cs_run.tracing",
    "compile_step": "cs_run.tracing",
    "step_closure": "cs_run.tracing",
    "trace": "cs_run.tracing",
    "Trainer": "cs_run.frontends.trainer",
    "current_executor": "cs_run.utils.data",
    "CompileTier": "cs_run.params",
}
"""Public name -> the module that defines it (imported on first use)."""

__all__ = sorted([*_NAMES, *_SUBMODULES])


def __getattr__(name: str):
    """Load a public name on first use (PEP 562) and keep it, so later lookups are plain attributes."""
    if name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    elif name in _SUBMODULES or (not name.startswith("__") and importlib.util.find_spec(f"cs_run.{name}")):
        value = importlib.import_module(f"cs_run.{name}")  # internal ones too (cs_run.replicas), as after an import
    else:
        raise AttributeError(f"module 'cs_run' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """cs_run itself. Importing a submodule binds it on its package; where a public function has the
    submodule's name (``cstorch.backend`` the function, ``cs_run.backend`` its module) the function wins,
    as it did when this file imported both eagerly."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _NAMES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


del _version_check
