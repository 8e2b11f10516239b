"""Which Model Zoo files a family's per-file test runs in `make test`, and which only in `make test-sweep`.

Training every file of every family 5 steps on CPU and CSX costs minutes; files that differ only in sizes take
the same code paths, so the default suite trains one file per code path and the sweep trains all of them.
"""

from __future__ import annotations

import pytest


def first_in_suite_rest_in_sweep(names, keep=()):
    """`names` as pytest params: the first (and any in `keep`) in the default suite, the others marked `sweep`."""
    in_suite = {names[0], *keep}
    return [pytest.param(name, id=str(name).rsplit("/", 1)[-1],
                         marks=[] if name in in_suite else [pytest.mark.sweep]) for name in names]
