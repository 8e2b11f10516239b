"""cs-run: the Cerebras PyTorch programming model on plain PyTorch.

Use it as ``import cs_run as cstorch``. Public names are re-exported here explicitly; anything not
re-exported is internal. Heavy dependencies (h5py, inductor, tensorboard) load where they are used.
"""

from cs_run import errors as errors
from cs_run.creation import full as full
from cs_run.creation import full_like as full_like
from cs_run.creation import manual_seed as manual_seed
from cs_run.creation import ones as ones
from cs_run.creation import ones_like as ones_like
from cs_run.creation import zeros as zeros
from cs_run.creation import zeros_like as zeros_like

__version__ = "0.1.0"

__all__ = [
    "errors",
    "full",
    "full_like",
    "manual_seed",
    "ones",
    "ones_like",
    "zeros",
    "zeros_like",
]

# Each block below belongs to one part of the package; edit only your own block.
# --- engine (issue 5): backend, compile, trace, closures, distributed, utils ---
from cs_run import distributed as distributed  # noqa: E402
from cs_run import utils as utils  # noqa: E402
from cs_run.backend import Backend as Backend  # noqa: E402
from cs_run.backend import backend as backend  # noqa: E402
from cs_run.backend import configure as configure  # noqa: E402
from cs_run.backend import current_backend as current_backend  # noqa: E402
from cs_run.backend import current_torch_device as current_torch_device  # noqa: E402
from cs_run.backend import use_cs as use_cs  # noqa: E402
from cs_run.tracing import checkpoint_closure as checkpoint_closure  # noqa: E402
from cs_run.tracing import compile as compile  # noqa: E402
from cs_run.tracing import compile_step as compile_step  # noqa: E402
from cs_run.tracing import step_closure as step_closure  # noqa: E402
from cs_run.tracing import trace as trace  # noqa: E402

__all__ += ["Backend", "backend", "checkpoint_closure", "compile", "compile_step", "configure",
            "current_backend", "current_torch_device", "distributed", "step_closure", "trace", "use_cs", "utils"]
# --- end engine ---
# --- optim (issue 3) ---
from cs_run import optim as optim

__all__ += ["optim"]
# --- end optim ---
# --- checkpoint (issue 4): save / load ---
from cs_run.checkpoint import load as load  # h5py is imported only inside the functions
from cs_run.checkpoint import save as save

__all__ += ["load", "save"]
# --- end checkpoint ---
# --- amp / metrics (issue 6) ---
from cs_run import amp as amp
from cs_run import metrics as metrics

__all__ += ["amp", "metrics"]
# --- end amp / metrics ---
# --- runners (issue 2 / 7) ---
from cs_run import runners as runners
from cs_run.modelzoo import run as run
from cs_run.trainer import Trainer as Trainer

__all__ += ["Trainer", "run", "runners"]
# --- end runners ---
# --- vendor compatibility (issue 17): cstorch.experimental is the same API ---
from cs_run.creation import from_numpy as from_numpy  # noqa: E402
from cs_run.creation import to_numpy as to_numpy  # noqa: E402
from cs_run.utils.data import current_executor as current_executor  # noqa: E402

__all__ += ["current_executor", "from_numpy", "to_numpy"]

from cs_run import experimental as experimental  # noqa: E402  (last: it re-exports everything above)

__all__ += ["experimental"]
# --- end vendor compatibility ---
