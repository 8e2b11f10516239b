"""Atomic file replacement: temp file in the target's folder, fsync, rename, fsync the folder.

A crash or ``kill -9`` at any moment leaves the old file (or nothing) under the final name, never a
partial one. Temporaries are named ``.<name>.<pid>.<token>.cs-run-tmp``; the next save into the same
folder removes those whose process is gone (or that are older than a day), files and the temporary
folders of sharded saves (:mod:`cs_run.checkpoint.sharded`) alike.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Iterator

__all__ = ["TMP_SUFFIX", "atomic_path", "clean_stale_temps", "fsync_path"]

logger = logging.getLogger(__name__)

TMP_SUFFIX = ".cs-run-tmp"
_STALE_AGE_S = 24 * 3600


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def clean_stale_temps(folder: str) -> list[str]:
    """Remove temporaries left in ``folder`` by saves that were killed; returns what was removed."""
    removed = []
    try:
        names = os.listdir(folder or ".")
    except OSError:
        return removed
    now = time.time()
    for name in names:
        if not (name.startswith(".") and name.endswith(TMP_SUFFIX)):
            continue
        parts = name[: -len(TMP_SUFFIX)].rsplit(".", 2)
        path = os.path.join(folder, name)
        try:
            pid = int(parts[1])
            stale = not _pid_alive(pid) or now - os.stat(path).st_mtime > _STALE_AGE_S
        except (ValueError, IndexError, OSError):
            continue
        if stale:
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and not os.path.islink(path):  # a sharded save's folder
                    shutil.rmtree(path)
                else:
                    os.remove(path)
                removed.append(path)
                logger.info("removed stale checkpoint temporary %s", path)
    return removed


def fsync_path(path: str, directory: bool = False) -> None:
    """fsync a file (its data and metadata) or a folder (its entries, e.g. after a rename)."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    fd = os.open(path or ".", flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success fsync it and rename it over ``path``.

    The caller writes the whole file (and its completion marker) to the yielded path. On any
    exception the temporary is removed and ``path`` is untouched.
    """
    folder, base = os.path.split(os.path.abspath(path))
    clean_stale_temps(folder)
    tmp = os.path.join(folder, f".{base}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_path(folder, directory=True)  # make the rename itself durable
