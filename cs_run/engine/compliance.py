"""Compliance: a traced CSX step must not read tensor values on the host.

Inside a traced step the tensors are fake (no data), so any read of a value (``.item()``, ``float(t)``,
``bool(t)``, ``print(t)``, ``if t > 0:``) cannot be answered. Instead of torch's internal error we
raise :class:`~cs_run.errors.ComplianceError` naming the *user's* file and line, and telling them to
read the value in a step closure.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from types import FrameType, TracebackType

import torch

from cs_run._torch_compat import TensorBase
from cs_run.errors import ComplianceError

__all__ = ["VALUE_READS", "compliance_error", "library_hint", "user_frame_location", "is_value_read"]

# Tensor methods that need the tensor's value on the host. Seen by the trace's TorchFunctionMode.
VALUE_READS = {
    torch.Tensor.item: ".item()",
    torch.Tensor.__bool__: "bool(tensor) (e.g. `if tensor:` or `if tensor > x:`)",
    torch.Tensor.__float__: "float(tensor)",
    torch.Tensor.__int__: "int(tensor)",
    torch.Tensor.__index__: "using a tensor as an index/int",
    torch.Tensor.__complex__: "complex(tensor)",
    torch.Tensor.tolist: ".tolist()",
    torch.Tensor.numpy: ".numpy()",
    torch.Tensor.__repr__: "print(tensor) / repr(tensor)",
    torch.Tensor.__str__: "print(tensor) / str(tensor)",
    torch.Tensor.__format__: "formatting a tensor (f-string / format)",
    torch.Tensor.__array__: "converting a tensor to numpy",
}
_VALUE_READ_NAMES = {"item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "__repr__",
                     "__format__", "__array__", "__complex__", "__str__"}


def is_value_read(func) -> str | None:
    """The description of ``func`` when it reads a tensor's value on the host, else None."""
    what = VALUE_READS.get(func)
    if what is None and getattr(func, "__name__", None) in _VALUE_READ_NAMES and _is_tensor_method(func):
        what = f".{func.__name__}()"
    return what


def _is_tensor_method(func) -> bool:
    return getattr(func, "__objclass__", None) in (torch.Tensor, TensorBase) or getattr(
        func, "__qualname__", ""
    ).startswith("Tensor.")


def _library_dirs() -> tuple[str, ...]:
    """Folders whose frames are never 'the user's line': torch, cs-run (and its mapped packages), stdlib."""
    dirs = {os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    for sub in ("optim", "runners", "checkpoint"):
        mod = sys.modules.get(f"cs_run.{sub}")
        dirs.update(getattr(mod, "__path__", []) if mod else [])
    dirs.add(sysconfig.get_paths()["stdlib"])
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


def _is_library_file(filename: str, lib_dirs: tuple[str, ...]) -> bool:
    if filename.startswith("<") and filename != "<stdin>" and not filename.startswith("<ipython"):
        return True  # generated code (fx, functools internals)
    return os.path.realpath(filename).startswith(lib_dirs)


def user_frame_location(frame: FrameType | None = None, tb: TracebackType | None = None) -> str:
    """``file:line`` of the innermost frame outside torch, cs-run and the standard library.

    Walks ``tb`` (innermost last) when given, else the current stack from ``frame`` outwards.
    """
    lib_dirs = _library_dirs()
    if tb is not None:
        frames = [(f.filename, f.lineno) for f in traceback.extract_tb(tb)][::-1]
    else:
        frames = [(f.filename, f.lineno) for f in traceback.extract_stack(frame or sys._getframe(1))][::-1]
    for filename, lineno in frames:
        if not _is_library_file(filename, lib_dirs):
            return f"{filename}:{lineno}"
    return "<unknown location>"


def library_hint(frame: FrameType | None) -> str:
    """A hint when the read happens inside torch.optim (whose optimizers are not trace-safe)."""
    while frame is not None:
        if f"{os.sep}torch{os.sep}optim{os.sep}" in frame.f_code.co_filename:
            return (" (inside torch.optim, whose optimizers read values and create state lazily; use the "
                    "compliant optimizers and schedulers of cs_run.optim)")
        frame = frame.f_back
    return ""


def compliance_error(what: str, location: str, hint: str = "") -> ComplianceError:
    """The one message for a host read of a tensor value inside a traced step."""
    return ComplianceError(
        f"{location}: {what}{hint} reads a tensor's value inside a traced CSX step; tensor values may only be "
        "read in a step closure (decorate a function with @cstorch.step_closure, pass the tensor to it "
        "and read it there), or use torch ops such as torch.where instead of Python control flow"
    )
