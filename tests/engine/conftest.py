"""Engine tests: each test starts and ends with no backend (one backend type per process).

``cs_run.backend._reset_for_tests`` is the documented test-only way to use several backend types in
one process. Shared helpers live in ``helpers.py``.
"""

from __future__ import annotations

import pytest

from cs_run.backend import _reset_for_tests


@pytest.fixture(autouse=True)
def fresh_backend(tmp_path, monkeypatch):
    """No backend before or after each test; the default ./cerebras_logs lands in tmp_path."""
    monkeypatch.chdir(tmp_path)
    with _reset_for_tests():
        yield
