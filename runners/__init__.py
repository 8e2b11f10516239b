"""The PyTorchBaseRunner hierarchy (the vendor's PyTorch runners guide): the loop, its hooks, and one runner per device."""

from cs_run.runners._build import build_lr_scheduler as build_lr_scheduler
from cs_run.runners._build import build_optimizer as build_optimizer
from cs_run.runners._checkpoint_files import latest_checkpoint as latest_checkpoint
from cs_run.runners._run_options import MODES as MODES
from cs_run.runners.base import PyTorchBaseRunner as PyTorchBaseRunner
from cs_run.runners.cs_runner import PyTorchCSCompiler as PyTorchCSCompiler
from cs_run.runners.cs_runner import PyTorchCSRunner as PyTorchCSRunner
from cs_run.runners.hooks import RunnerHooks as RunnerHooks
from cs_run.runners.pytorch_runner import PyTorchRunner as PyTorchRunner

__all__ = ["PyTorchBaseRunner", "PyTorchCSCompiler", "PyTorchCSRunner", "PyTorchRunner", "RunnerHooks"]
# build_optimizer, build_lr_scheduler (a params block's optimizer and schedule, as a runner builds them),
# latest_checkpoint (model_dir's newest) and MODES (the modes a run takes) serve the front ends (cs_run.frontends), which do not reach into
# the runners' private modules; they are not part of the vendor-named API above.
