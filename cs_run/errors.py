"""Errors a user can act on.

Every message says what is wrong, where (key, file:line, tensor name) and how to fix it, in one line.
The CLI turns a :class:`CsRunError` into ``Error: <message>`` and exits with its ``exit_code``:
2 when the user's input is wrong (params, usage), 1 when a run failed.
"""

from __future__ import annotations

__all__ = [
    "CsRunError",
    "ParamsError",
    "ComplianceError",
    "CheckpointError",
    "DataError",
    "BackendError",
    "TrainingError",
    "ModelError",
]


class CsRunError(Exception):
    """Base of every error cs-run raises on purpose."""

    exit_code: int = 1


class ParamsError(CsRunError, ValueError):
    """A params file or override is wrong: unknown key, wrong type, out of range, missing."""

    exit_code = 2


class ComplianceError(CsRunError, RuntimeError):
    """A traced step did something that cannot be captured (e.g. read a tensor's value)."""

    exit_code = 1


class CheckpointError(CsRunError, RuntimeError):
    """A checkpoint cannot be written or read (truncated, corrupted, incomplete, newer version)."""

    exit_code = 1


class DataError(CsRunError, RuntimeError):
    """A data file cannot be read or written: a damaged shard, a token id the model cannot embed, a
    write of shards that failed (the output written before is kept)."""

    exit_code = 1


class BackendError(CsRunError, RuntimeError):
    """The backend was configured in a way that cannot work."""

    exit_code = 1


class TrainingError(CsRunError, RuntimeError):
    """A run stopped because training went wrong (e.g. a NaN or infinite loss)."""

    exit_code = 1


class ModelError(CsRunError, TypeError):
    """The user's model broke the runners' contract: ``forward(batch)`` must return the loss, a scalar
    floating-point tensor (that depends on the parameters, when training)."""

    exit_code = 1
