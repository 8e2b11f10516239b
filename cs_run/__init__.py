"""cs-run: the Cerebras PyTorch programming model on plain PyTorch.

Use it as ``import cs_run as cstorch``. Public names are re-exported here explicitly; anything not
re-exported is internal. Heavy optional dependencies (h5py, inductor, tensorboard, matplotlib,
safetensors) load where they are used. docs/architecture.md describes the layers.
"""

from cs_run import _version_check  # first: a clear error on a torch this code was not run with
from cs_run import amp as amp
from cs_run import distributed as distributed
from cs_run import errors as errors
from cs_run import metrics as metrics
from cs_run import optim as optim
from cs_run import runners as runners
from cs_run import utils as utils
from cs_run.backend import Backend as Backend
from cs_run.backend import backend as backend
from cs_run.backend import configure as configure
from cs_run.backend import current_backend as current_backend
from cs_run.backend import current_torch_device as current_torch_device
from cs_run.backend import use_cs as use_cs
from cs_run.checkpoint import load as load
from cs_run.checkpoint import save as save
from cs_run.creation import from_numpy as from_numpy
from cs_run.creation import full as full
from cs_run.creation import full_like as full_like
from cs_run.creation import manual_seed as manual_seed
from cs_run.creation import ones as ones
from cs_run.creation import ones_like as ones_like
from cs_run.creation import to_numpy as to_numpy
from cs_run.creation import zeros as zeros
from cs_run.creation import zeros_like as zeros_like
from cs_run.modelzoo import run as run
from cs_run.tracing import checkpoint_closure as checkpoint_closure
from cs_run.tracing import compile as compile
from cs_run.tracing import compile_step as compile_step
from cs_run.tracing import step_closure as step_closure
from cs_run.tracing import trace as trace
from cs_run.trainer import Trainer as Trainer
from cs_run.utils.data import current_executor as current_executor

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "Trainer",
    "amp",
    "backend",
    "checkpoint_closure",
    "compile",
    "compile_step",
    "configure",
    "current_backend",
    "current_executor",
    "current_torch_device",
    "distributed",
    "errors",
    "experimental",
    "from_numpy",
    "full",
    "full_like",
    "load",
    "manual_seed",
    "metrics",
    "ones",
    "ones_like",
    "optim",
    "run",
    "runners",
    "save",
    "step_closure",
    "to_numpy",
    "trace",
    "use_cs",
    "utils",
    "zeros",
    "zeros_like",
]

from cs_run import experimental as experimental  # noqa: E402  (last: the vendor's alias module re-exports the above)

del _version_check
