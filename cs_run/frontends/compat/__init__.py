"""Run a vendor script unchanged: the vendor's import names resolve to cs-run, in this process only.

``cs-run exec script.py [args]`` (or ``python -m cs_run.frontends.compat script.py [args]``) installs
:class:`VendorFinder` at the front of ``sys.meta_path`` and runs the script as ``__main__``. Nothing
named ``cerebras`` is installed into site-packages; another process sees none of this.

Resolved (see :data:`PROVIDED`):

* ``cerebras.pytorch`` and ``cerebras_pytorch`` (1.9/2.0) -> ``cs_run``; their sub-modules -> the
  ``cs_run`` sub-module of the same name (``cerebras_pytorch.experimental.metrics`` -> ``cs_run.metrics``);
* ``modelzoo.common.pytorch`` / ``modelzoo.common.run_utils`` (1.x) and ``cerebras.modelzoo.common`` /
  ``cerebras.modelzoo.trainer`` (2.x): the parts cs-run implements (run, run_utils.main, the CLI's
  get_params_from_args, cb_model, PyTorchBaseModel, SampleGenerator, get_streaming_batch_size, metrics,
  Trainer);
* every other ``modelzoo.*`` / ``cerebras.modelzoo.*`` module (the user's model code, e.g.
  ``modelzoo.fc_mnist.pytorch.data``) comes from the files on ``sys.path`` as usual.

A vendor module under the resolved names that cs-run does not provide raises an ImportError naming it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import types
from typing import Optional, Sequence

from cs_run.errors import ParamsError
from cs_run.exits import report

__all__ = ["PROVIDED", "VendorFinder", "install", "uninstall", "run_script", "main"]

_V1 = "cs_run.frontends.compat.modelzoo_v1"
_PKG = None  # a synthetic package node

PROVIDED: dict[str, Optional[str]] = {
    # cerebras namespace
    "cerebras": _PKG,
    "cerebras.pytorch": "cs_run",
    "cerebras_pytorch": "cs_run",
    "cerebras_pytorch.experimental.metrics": "cs_run.metrics",
    # Model Zoo 1.x
    "modelzoo": _PKG,
    "modelzoo.common": _PKG,
    "modelzoo.common.pytorch": _PKG,
    "modelzoo.common.pytorch.run_utils": _V1,
    "modelzoo.common.pytorch.half_dtype": _V1,
    "modelzoo.common.pytorch.utils": _V1,
    "modelzoo.common.pytorch.input_utils": _V1,
    "modelzoo.common.pytorch.PyTorchBaseModel": _V1,
    "modelzoo.common.pytorch.cb_model": "cs_run.frontends.compat.cb_model",
    "modelzoo.common.pytorch.metrics": "cs_run.metrics",
    "modelzoo.common.run_utils": _PKG,
    "modelzoo.common.run_utils.cli_pytorch": _V1,
    # Model Zoo 2.x
    "cerebras.modelzoo": _PKG,
    "cerebras.modelzoo.common": _PKG,
    "cerebras.modelzoo.common.run_utils": _V1,
    "cerebras.modelzoo.common.input_utils": _V1,
    "cerebras.modelzoo.common.pytorch_utils": _V1,
    "cerebras.modelzoo.common.half_dtype": _V1,
    "cerebras.modelzoo.common.utils": _PKG,
    "cerebras.modelzoo.common.utils.run": _PKG,
    "cerebras.modelzoo.common.utils.run.cli_pytorch": _V1,
    "cerebras.modelzoo.trainer": "cs_run.frontends.compat.trainer",
}
"""Vendor module -> cs-run module (None: a package node whose other children are looked up on disk)."""

_VENDOR_ROOTS = ("cerebras.pytorch", "cerebras_pytorch", "modelzoo.common", "cerebras.modelzoo.common",
                 "cerebras.modelzoo.trainer")
"""Sub-trees that belong wholly to the vendor: a name under them that is not provided is an error."""
_CS_RUN_PREFIXES = {"cerebras.pytorch": "cs_run", "cerebras_pytorch": "cs_run"}


def _disk_path(name: str) -> list[str]:
    """Folders on sys.path holding the package ``name`` (the user's Model Zoo files)."""
    rel = os.path.join(*name.split("."))
    return [os.path.join(entry or ".", rel) for entry in sys.path
            if isinstance(entry, str) and os.path.isdir(os.path.join(entry or ".", rel))]


def _target(fullname: str) -> Optional[str]:
    if fullname in PROVIDED:
        return PROVIDED[fullname] or ""
    for prefix, base in _CS_RUN_PREFIXES.items():
        if fullname.startswith(prefix + "."):
            candidate = base + fullname[len(prefix):]
            try:
                if importlib.util.find_spec(candidate) is not None:
                    return candidate
            except ModuleNotFoundError:
                pass
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):
        if not self.target:
            module = types.ModuleType(spec.name)
            module.__path__ = _disk_path(spec.name)
            module.__doc__ = f"cs-run's stand-in for the vendor package {spec.name}"
            return module
        return importlib.import_module(self.target)

    def exec_module(self, module) -> None:
        pass


class VendorFinder(importlib.abc.MetaPathFinder):
    """Resolves the vendor's module names to cs-run (see :data:`PROVIDED`)."""

    def find_spec(self, fullname, path=None, target=None):
        resolved = _target(fullname)
        if resolved is not None:
            is_pkg = not resolved or hasattr(importlib.import_module(resolved), "__path__")
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(resolved), is_package=is_pkg)
        if any(fullname == root or fullname.startswith(root + ".") for root in _VENDOR_ROOTS):
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: it is a Cerebras vendor module that cs-run does not provide "
                "(cs-run provides cerebras.pytorch / cerebras_pytorch as cs_run, and of the Model Zoo: run, "
                "run_utils.main, get_params_from_args, cb_model, PyTorchBaseModel, SampleGenerator, "
                "get_streaming_batch_size, metrics, Trainer; see the README, 'Running vendor scripts')",
                name=fullname)
        return None


_FINDER = VendorFinder()


def install() -> None:
    """Put the finder first on sys.meta_path (idempotent)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    """Remove the finder and every module it resolved from sys.modules."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in list(sys.modules):
        if name in PROVIDED or any(name == r or name.startswith(r + ".") for r in ("cerebras", "cerebras_pytorch",
                                                                                  "modelzoo")):
            del sys.modules[name]


def run_script(path: str, argv: Sequence[str] = ()) -> None:
    """Run ``path`` as ``__main__`` with ``sys.argv = [path, *argv]`` and the vendor names resolved."""
    if not os.path.isfile(path):
        raise ParamsError(f"exec: script not found: {path}")
    install()
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m cs_run.frontends.compat script.py [args]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m cs_run.frontends.compat script.py [args...]\n\n" + (__doc__ or ""))
        raise SystemExit(0 if argv else 2)
    try:
        run_script(argv[0], argv[1:])
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - reported the one way every entry point reports
        raise SystemExit(report(e)) from None  # a SyntaxError in the script: the user's line, not cs-run's
