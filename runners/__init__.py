"""The PyTorchBaseRunner hierarchy (the vendor's PyTorch runners guide): the loop, its hooks, and one runner per device."""

from cs_run.runners.base import PyTorchBaseRunner as PyTorchBaseRunner
from cs_run.runners.cs_runner import PyTorchCSCompiler as PyTorchCSCompiler
from cs_run.runners.cs_runner import PyTorchCSRunner as PyTorchCSRunner
from cs_run.runners.hooks import RunnerHooks as RunnerHooks
from cs_run.runners.pytorch_runner import PyTorchRunner as PyTorchRunner

__all__ = ["PyTorchBaseRunner", "PyTorchCSCompiler", "PyTorchCSRunner", "PyTorchRunner", "RunnerHooks"]
