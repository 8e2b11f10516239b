"""Which frames of a traceback are the user's code: not cs-run's own packages, the standard library,
installed packages or Python's frozen modules. The one rule behind the errors that point at the user's
file:line (:mod:`cs_run.exits` for errors raised while a run calls the user's functions,
:mod:`cs_run.registry` for a user module that fails to import)."""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from pathlib import Path

__all__ = ["own_roots", "library_roots", "user_frames", "is_user_file"]


def own_roots() -> tuple[str, ...]:
    """cs-run's own package folders (an error raised in them is cs-run's, not the user's): the cs_run package
    and every package of it installed from a top-level folder (setup.cfg package_dir: runners/, parallel/,
    models/, ...), read from the loaded modules so a new folder needs no list here."""
    roots = {str(Path(__file__).resolve().parent)}  # the cs_run package
    for name, module in list(sys.modules.items()):
        if name.startswith("cs_run."):
            roots.update(str(Path(p).resolve()) for p in getattr(module, "__path__", None) or [])
    return tuple(root + os.sep for root in roots)


def library_roots() -> tuple[str, ...]:
    """Folders whose files are not the user's: cs-run's own packages, the stdlib, installed packages."""
    roots = {root.removesuffix(os.sep) for root in own_roots()}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(str(Path(path).resolve()))
    return tuple(root + os.sep for root in roots)


def is_user_file(filename: str, roots: tuple[str, ...] | None = None) -> bool:
    """True for a real file outside :func:`library_roots` (``<frozen ...>``, ``<string>`` are not)."""
    if not filename or filename.startswith("<"):
        return False
    return not str(Path(filename).resolve()).startswith(library_roots() if roots is None else roots)


def user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback in the user's files, outermost first."""
    roots = library_roots()
    return [f for f in traceback.extract_tb(exc.__traceback__) if is_user_file(f.filename, roots)]
