"""One writer per model_dir: the folder is checked before any user code runs, locked for a run's lifetime,
and cleared of the temporaries that killed saves left behind.

The lock is an advisory ``fcntl.flock`` on ``model_dir/.cs_run.lock``, which holds the owner's pid. The
kernel drops it when the process exits, however it exits, so a killed run never leaves a stale lock;
the file itself stays (removing it would let two runs lock two different files).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from cs_run.checkpoint.atomic import TMP_SUFFIX
from cs_run.errors import CsRunError, ParamsError

__all__ = ["LOCK_NAME", "ModelDirBusyError", "check_model_dir", "check_not_locked", "model_dir_lock",
           "remove_stale_temps"]

logger = logging.getLogger("cs_run.runners")

LOCK_NAME = ".cs_run.lock"
# Temporaries a killed run can leave: checkpoint saves (checkpoint.atomic) and the resolved params.
_TEMP_SUFFIXES = (TMP_SUFFIX, ".yaml.tmp")


class ModelDirBusyError(CsRunError, RuntimeError):
    """Another run holds model_dir; nothing of it was touched."""

    exit_code = 1


def check_model_dir(model_dir: str | os.PathLike) -> None:
    """Fail before any work when model_dir cannot be a writable folder (a file, read-only, under a file).

    Raises:
        ParamsError: naming runconfig.model_dir, what is wrong with it and how to fix it.
    """
    path = Path(model_dir)
    fix = "choose another --model_dir (or runconfig.model_dir)"
    if path.exists() and not path.is_dir():
        raise ParamsError(f"params: runconfig.model_dir: {path} exists and is not a folder; {fix}")
    existing = path
    while not existing.exists():  # the folder that mkdir would create model_dir in
        existing = existing.parent
    if not existing.is_dir():
        raise ParamsError(f"params: runconfig.model_dir: {existing} is not a folder, so {path} cannot be "
                          f"created; {fix}")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == path else f"cannot be created: {existing} is not writable"
        raise ParamsError(f"params: runconfig.model_dir: {path} {what}; {fix}")


def _busy(model_dir: Path, lock_path: Path) -> ModelDirBusyError:
    try:
        pid = lock_path.read_text().strip() or "unknown"
    except (OSError, UnicodeDecodeError):
        pid = "unknown"
    return ModelDirBusyError(f"model_dir {model_dir} is in use by another cs-run run (pid {pid}, lock "
                             f"{lock_path}); wait for it to end or stop it, or use another --model_dir")


def check_not_locked(model_dir: str | os.PathLike) -> None:
    """Fail at once, before the model is built, when another run holds model_dir (creates nothing)."""
    lock_path = Path(model_dir) / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return  # no lock file yet (or unreadable: model_dir_lock reports that)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _busy(Path(model_dir), lock_path) from None
    finally:
        os.close(fd)  # closing drops the probe's shared lock


@contextlib.contextmanager
def model_dir_lock(model_dir: str | os.PathLike) -> Iterator[Path]:
    """Create model_dir, hold its lock for the ``with`` block, and remove stale temporaries once held.

    Raises:
        ModelDirBusyError: another process holds the lock (the message names its pid).
        CsRunError: model_dir cannot be created or written (e.g. the disk is full).
    """
    model_dir = Path(model_dir)
    lock_path = model_dir / LOCK_NAME
    created = [p for p in (model_dir, *model_dir.parents) if not p.exists()]  # removed again if we fail here
    new_lock = not lock_path.exists()
    fd = None
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            new_lock, created = False, []
            raise _busy(model_dir, lock_path) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except (OSError, ModelDirBusyError) as e:
        if fd is not None:
            os.close(fd)
        if new_lock:
            with contextlib.suppress(OSError):
                lock_path.unlink()
        for folder in created:  # deepest first: a failed start leaves no folder behind
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(e, ModelDirBusyError):
            raise
        raise _write_error(model_dir, e) from None
    try:
        remove_stale_temps(model_dir)
        yield model_dir
    finally:
        os.close(fd)  # releases the lock


def remove_stale_temps(model_dir: Path) -> list[Path]:
    """Remove the temporaries of saves killed mid-write. Called with the lock held, so no live cs-run
    process is writing any of them."""
    removed = []
    for entry in model_dir.iterdir():
        if entry.name.endswith(_TEMP_SUFFIXES) and entry.is_file():
            with contextlib.suppress(OSError):
                entry.unlink()
                removed.append(entry)
                logger.info("Removed %s, left by a save that did not finish", entry.name)
    return removed


def _write_error(model_dir: Path, e: OSError) -> CsRunError:
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST):
        return ParamsError(f"params: runconfig.model_dir: cannot write to {model_dir} ({e.strerror}); choose "
                           "another --model_dir (or runconfig.model_dir)")
    return CsRunError(f"cannot write to model_dir {model_dir}: {e.strerror or e}; free space or choose "
                      "another --model_dir")
