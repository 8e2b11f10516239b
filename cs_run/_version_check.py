"""The torch versions this code was run with: 2.11.x through 2.15.x. Anything else fails at ``import cs_run``
with one clear line.

The CSX engine uses torch internals that change between minor releases without notice (make_fx's
proxy slots, fake tensors, inductor's ``aot_compile`` and ``standalone_compile``, AOTInductor's C++
runner, ``torch.utils._pytree``); cs_run/_torch_compat.py holds every one of them and the differences
between the versions of the range. Those versions were run (the suite on 2.13, its smoke subset on
2.14, ``make test-torch-2.14``; the engine, optim and checkpoint tests on 2.15 by hand, 2026-11-27); a
version outside the range is refused rather than left to fail deep inside a trace. ``CS_RUN_ANY_TORCH=1``
skips the check (at your own risk, e.g. to try a new torch). The installed version is read from the
package metadata, so ``import cs_run`` does not import torch (the torch already imported, when there is
one, is checked).

Uncaught, the refusal prints one ``Error:`` line and no traceback (also from ``cs-run --help``, whose
entry point imports cs_run first): the import installs a ``sys.excepthook`` that knows only this error.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys

__all__ = ["SUPPORTED_TORCH", "UnsupportedTorchError", "check_torch_version", "installed_torch_version",
           "torch_requirement"]

# The oldest and the newest minor release run, both included (setup.cfg's install_requires says the same).
SUPPORTED_TORCH = ((2, 11), (2, 15))


class UnsupportedTorchError(ImportError):
    """The installed torch is outside :data:`SUPPORTED_TORCH` (an ImportError: ``import cs_run`` fails)."""


def torch_requirement() -> str:
    """The pip requirement of the supported range, e.g. ``torch>=2.11,<2.16``."""
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_TORCH
    return f"torch>={low_major}.{low_minor},<{high_major}.{high_minor + 1}"


def _range() -> str:
    (low_major, low_minor), (high_major, high_minor) = SUPPORTED_TORCH
    return f"{low_major}.{low_minor} to {high_major}.{high_minor}"


def check_torch_version(version: str) -> None:
    """Raise UnsupportedTorchError unless ``version`` (``torch.__version__``) is a release in the range."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match and SUPPORTED_TORCH[0] <= (int(match.group(1)), int(match.group(2))) <= SUPPORTED_TORCH[1]:
        return
    raise UnsupportedTorchError(
        f"cs-run needs torch {_range()} (its CSX engine uses torch internals that change between releases) but "
        f"found torch {version}; install one with pip install '{torch_requirement()}', or set CS_RUN_ANY_TORCH=1 "
        "to try anyway")


def installed_torch_version() -> str:
    """The imported torch's version, else the installed one's (its metadata; torch is not imported)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(getattr(torch, "__version__", None), str):
        return torch.__version__
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        raise UnsupportedTorchError(f"cs-run needs torch {_range()}, which is not installed; install it first with "
                                    f"pip install '{torch_requirement()}'") from None


def _refuse_in_one_line() -> None:
    """Runs the check; an uncaught refusal prints ``Error: <message>`` alone (exit status 1)."""
    try:
        check_torch_version(installed_torch_version())
    except UnsupportedTorchError as error:
        refusal, previous = error, sys.excepthook  # (``error`` itself is unbound when the except block ends)

        def hook(kind: type[BaseException], value: BaseException, tb: object) -> None:
            if value is refusal:
                print(f"Error: {value}", file=sys.stderr)
            else:
                previous(kind, value, tb)

        sys.excepthook = hook
        raise refusal.with_traceback(None) from None


if os.environ.get("CS_RUN_ANY_TORCH") != "1":
    _refuse_in_one_line()
