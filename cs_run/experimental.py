"""``cstorch.experimental``: the 1.9/2.0 experimental API (the porting guide's ``cerebras_pytorch.experimental``).

It became the main API; every name is looked up on ``cs_run`` itself (same objects), so this module
imports nothing from the package (no import cycle) and stays in step with it.
"""

import sys
from typing import Any

__path__: list = []  # a package for the import system, so the vendor's experimental.metrics can alias cs_run.metrics


def __getattr__(name: str) -> Any:
    return getattr(sys.modules["cs_run"], name)


def __dir__() -> list:
    return [n for n in sys.modules["cs_run"].__all__ if n != "experimental"]
