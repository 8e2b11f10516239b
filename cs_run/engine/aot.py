"""The inductor tier on CPU, ahead of time: the whole step as one shared library run by torch's C++ runner
(docs/architecture.md#the-csx-engine-cs_runengine).

Inductor's AOT mode lowers the step's aten graph to C++ kernels *and* a C++ wrapper that calls them
and the extern kernels (matmuls, attention), compiled into one ``.so``. Two things follow:

* a replay is one call into C++ (``AOTIModelContainerRunnerCpu.run``) instead of a Python wrapper
  making one call per kernel, which is most of what an overhead-bound step spends outside its math;
* a later process loads the library with ``dlopen`` and never imports inductor's compiler
  (``torch._inductor.compile_fx`` and its lowering: seconds of imports on a slow host), so a warm start
  costs the trace and a file read.

A step with collectives (replicas) is called through the library's C interface with ``ctypes``, which
releases Python's GIL for the call; torch's pybind runner keeps it. Such a step waits inside the library
for its all-reduce, and gloo's worker thread takes the GIL when it destroys a finished collective's
work (``~AsyncWork`` -> ``gil_scoped_acquire``, seen in gdb), so with the GIL held the replicas
deadlock. Other steps keep torch's runner: the ``ctypes`` call costs a few microseconds more per input
tensor.

The library mutates the state tensors it is given in place, like the graph does. It was built for the
strides the first batch had; a batch with other strides is copied into those strides first.
The saved file's name carries the SHA-256 of its key and its bytes: a damaged or truncated file, or
another graph's library put under this graph's key, is rebuilt, never loaded (a ``dlopen`` of a
damaged library can crash the process; another graph's fails on the first step's shapes).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from cs_run import _torch_compat

__all__ = ["AOTStep", "Library", "LibraryError", "build", "find_artifact", "load"]

_SUFFIX = ".aoti.so"
logger = logging.getLogger(__name__)


class LibraryError(RuntimeError):
    """A call into a step library failed; the message is the library's (the C++ exception it caught)."""


_HANDLE = ctypes.c_void_p
_HANDLES = ctypes.POINTER(ctypes.c_void_p)
_SIGNATURES = {  # AOTInductor's C interface (torch/csrc/inductor/aoti_runtime/interface.h); each returns 0 on success
    "AOTInductorModelContainerCreateWithDevice": [ctypes.POINTER(_HANDLE), ctypes.c_size_t, ctypes.c_char_p,
                                                  ctypes.c_char_p],
    "AOTInductorModelContainerDelete": [_HANDLE],
    "AOTInductorModelContainerGetNumInputs": [_HANDLE, ctypes.POINTER(ctypes.c_size_t)],
    "AOTInductorModelContainerGetNumOutputs": [_HANDLE, ctypes.POINTER(ctypes.c_size_t)],
    "AOTInductorModelContainerRun": [_HANDLE, _HANDLES, ctypes.c_size_t, _HANDLES, ctypes.c_size_t, ctypes.c_void_p,
                                     ctypes.c_void_p],
}
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer  # the AtenTensorHandle inside torch's capsules
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype, _capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Library:
    """One loaded step library (one model instance, on the CPU): ``run(inputs)`` -> its outputs.

    What torch's ``AOTIModelContainerRunnerCpu`` does, except that the call releases the GIL: each input
    becomes a new tensor handle the library takes over, the outputs come back as handles the caller owns.
    """

    def __init__(self, path: Path) -> None:
        self._lib = ctypes.CDLL(str(path))
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(self._lib, name)
            fn.restype, fn.argtypes = ctypes.c_int32, argtypes
        self._container = _HANDLE()
        self._check("create", self._lib.AOTInductorModelContainerCreateWithDevice(
            ctypes.byref(self._container), 1, b"cpu", None))
        self._num_inputs = self._count("Inputs")
        self._num_outputs = self._count("Outputs")

    def _count(self, what: str) -> int:
        count = ctypes.c_size_t()
        self._check(f"count of {what.lower()}", getattr(self._lib, f"AOTInductorModelContainerGetNum{what}")(
            self._container, ctypes.byref(count)))
        return count.value

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(inputs) != self._num_inputs:  # the library checks this outside its error handling: it would abort
            raise LibraryError(f"the step library takes {self._num_inputs} tensors, not {len(inputs)}")
        capsules = torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors(inputs)
        handles = (ctypes.c_void_p * len(capsules))(*[_capsule_pointer(c, None) for c in capsules])
        outputs = (ctypes.c_void_p * self._num_outputs)()
        self._check("run", self._lib.AOTInductorModelContainerRun(  # the GIL is released for the call
            self._container, handles, len(capsules), outputs, self._num_outputs, None, None))
        return torch._C._aoti.alloc_tensors_by_stealing_from_void_ptrs([_capsule_new(h, None, None) for h in outputs])

    def _check(self, what: str, code: int) -> None:
        if code == 0:
            return
        message = ""
        last_error = getattr(self._lib, "AOTInductorGetLastError", None)  # newer libraries only
        if last_error is not None:
            text = ctypes.c_char_p()
            last_error.restype, last_error.argtypes = ctypes.c_int32, [ctypes.POINTER(ctypes.c_char_p)]
            if last_error(ctypes.byref(text)) == 0 and text.value:
                message = text.value.decode(errors="replace")
        raise LibraryError(f"the step library's {what} failed" + (f": {message}" if message else
                                                                    " (its message is logged above)"))

    def __del__(self) -> None:
        container, lib = getattr(self, "_container", None), getattr(self, "_lib", None)
        if container and container.value and lib is not None:
            lib.AOTInductorModelContainerDelete(container)


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


def load(path: Path, num_state: int, batch: list[torch.Tensor], release_gil: bool = False) -> AOTStep:
    """Loads a saved step library (a ``dlopen``; no inductor import); ``release_gil`` for a step with
    collectives (see the module's docstring)."""
    runner = Library(path) if release_gil else _torch_compat.aoti_cpu_runner(path)
    return AOTStep(runner, num_state, batch, path)


def _digest(path: Path, key: str) -> str:
    h = hashlib.sha256(key.encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:24]
