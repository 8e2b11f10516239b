"""``cstorch.experimental``: the 1.9/2.0 experimental API (seed 001's ``cerebras_pytorch.experimental``).

It became the main API; every name is the same object as in ``cs_run``.
"""

from cs_run import *  # noqa: F403  (the alias module re-exports the whole public API)
from cs_run import __all__ as _all

__all__ = list(_all)

__path__: list = []  # a package for the import system, so the vendor's experimental.metrics can alias cs_run.metrics
