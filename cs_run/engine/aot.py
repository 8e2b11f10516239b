"""The inductor tier on CPU, ahead of time: the whole step as one shared library run by torch's C++ runner
(docs/architecture.md#the-csx-engine-cs_runengine).

Inductor's AOT mode lowers the step's aten graph to C++ kernels *and* a C++ wrapper that calls them
and the extern kernels (matmuls, attention), compiled into one ``.so``. Two things follow:

* a replay is one call into C++ (``AOTIModelContainerRunnerCpu.run``) instead of a Python wrapper
  making one call per kernel, which is most of what an overhead-bound step spends outside its math;
* a later process loads the library with ``dlopen`` and never imports inductor's compiler
  (``torch._inductor.compile_fx`` and its lowering: seconds of imports on a slow host), so a warm start
  costs the trace and a file read.

The library mutates the state tensors it is given in place, like the graph does. It was built for the
strides the first batch had; a batch with other strides is copied into those strides first.
The saved file's name carries the SHA-256 of its key and its bytes: a damaged or truncated file, or
another graph's library put under this graph's key, is rebuilt, never loaded (a ``dlopen`` of a
damaged library can crash the process; another graph's fails on the first step's shapes).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from cs_run import _torch_compat

__all__ = ["AOTStep", "build", "find_artifact", "load"]

_SUFFIX = ".aoti.so"
logger = logging.getLogger(__name__)


class AOTStep:
    """A loaded step library: ``step(*state, *batch)`` -> the graph's outputs (a list of tensors)."""

    def __init__(self, runner: Any, num_state: int, batch: list[torch.Tensor], path: Path | None) -> None:
        self._runner = runner
        self._num_state = num_state
        self._strides = tuple(t.stride() for t in batch)
        self.path = path

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        args = list(inputs)
        batch = args[self._num_state:]
        if tuple(t.stride() for t in batch) != self._strides:  # the library indexes with the built strides
            args[self._num_state:] = [
                t if t.stride() == s else torch.empty_strided(t.shape, s, dtype=t.dtype, device=t.device).copy_(t)
                for t, s in zip(batch, self._strides)
            ]
        return self._runner.run(args)


def build(gm: torch.fx.GraphModule, inputs: list[torch.Tensor], final_dir: Path, key: str) -> Path:
    """Compiles ``gm`` for ``inputs`` into ``final_dir/<key>.<sha>.aoti.so`` (written whole or not at all).

    The inputs are only looked at (as fake tensors): nothing runs and no state changes.
    """
    final_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=final_dir))
    try:
        built = _torch_compat.aot_compile(gm, tuple(inputs), work / "step.so")
        final = final_dir / f"{key}.{_digest(built, key)}{_SUFFIX}"
        os.replace(built, final)
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)


def find_artifact(final_dir: Path, key: str) -> Path | None:
    """The saved library for ``key`` whose key and bytes match the digest in its name; None if there is none.

    A file that does not match (damaged, truncated, overwritten, or another graph's library renamed to
    this key) is never loaded: it is removed with a warning (it is a cache entry; the step is compiled again).
    """
    for path in sorted(final_dir.glob(f"{key}.*{_SUFFIX}")):
        digest = path.name[len(key) + 1:-len(_SUFFIX)]
        try:
            if _digest(path, key) == digest:
                return path
            logger.warning("compile cache: %s is damaged or another graph's library (its key and bytes do not "
                           "match its digest); removed, the step is compiled again", path)
            path.unlink()
        except OSError as exc:
            logger.warning("compile cache: cannot read %s (%s); compiling instead", path, exc)
    return None


def load(path: Path, num_state: int, batch: list[torch.Tensor]) -> AOTStep:
    """Loads a saved step library (a ``dlopen``; no inductor import)."""
    runner = _torch_compat.aoti_cpu_runner(path)
    return AOTStep(runner, num_state, batch, path)


def _digest(path: Path, key: str) -> str:
    h = hashlib.sha256(key.encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:24]
