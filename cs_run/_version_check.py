"""The torch this code was run with: 2.13.x. Anything else fails at ``import cs_run`` with one clear line.

The CSX engine uses torch internals that change between minor releases without notice (make_fx's
proxy slots, fake tensors and their data-dependent exceptions, ``torch._guards``, inductor's
``compile_fx``, ``torch.utils._pytree``). They were only run on torch 2.13, so another version is
refused rather than left to fail deep inside a trace. ``CS_RUN_ANY_TORCH=1`` skips the check (at
your own risk, e.g. to try a new torch). The installed version is read from the package metadata, so
``import cs_run`` does not import torch (the torch already imported, when there is one, is checked).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys

__all__ = ["SUPPORTED_TORCH", "check_torch_version", "installed_torch_version"]

SUPPORTED_TORCH = (2, 13)


def check_torch_version(version: str) -> None:
    """Raise ImportError unless ``version`` (``torch.__version__``) is a 2.13.x release."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match and (int(match.group(1)), int(match.group(2))) == SUPPORTED_TORCH:
        return
    wanted = ".".join(map(str, SUPPORTED_TORCH))
    raise ImportError(f"cs-run needs torch {wanted}.x (its CSX engine uses torch internals that change between "
                      f"releases) but found torch {version}; install it with pip install 'torch=={wanted}.*', "
                      "or set CS_RUN_ANY_TORCH=1 to try anyway")


def installed_torch_version() -> str:
    """The imported torch's version, else the installed one's (its metadata; torch is not imported)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(getattr(torch, "__version__", None), str):
        return torch.__version__
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        wanted = ".".join(map(str, SUPPORTED_TORCH))
        raise ImportError(f"cs-run needs torch {wanted}.x, which is not installed; install it first with "
                          f"pip install 'torch=={wanted}.*'") from None


if os.environ.get("CS_RUN_ANY_TORCH") != "1":
    check_torch_version(installed_torch_version())
