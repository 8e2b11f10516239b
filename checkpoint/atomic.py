"""Atomic file replacement: temp file in the target's folder, fsync, rename, fsync the folder.

A crash or ``kill -9`` at any moment leaves the old file (or nothing) under the final name, never a
partial one. Temporaries are named ``.<name>.<pid>.<token>.cs-run-tmp``; the next save into the same
folder removes those whose process is gone (or that are older than a day), files and the temporary
folders of sharded saves (:mod:`cs_run.checkpoint.sharded`) alike.

A checkpoint name may hold a file or a sharded save's folder, and a save of either form may replace
the other (or a folder the same form): no single rename does that, so :func:`replace` first renames the
old one to its *aside* name ``.<name>.cs-run-aside``, which the readers recognise (:func:`resolve`), then
renames the new one in and removes the aside. A crash between the two renames leaves the old checkpoint
whole under the aside name; the next read finds it there and the next save of that name renames it back
first (:func:`recover_aside`). Asides are never swept as stale temporaries.

A replica whose launcher has ended commits nothing: :func:`replace` asks right before its first rename
(:mod:`cs_run._launcher_watch`) and raises instead, leaving the temporary to be removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Iterator

from cs_run import _launcher_watch

__all__ = ["ASIDE_SUFFIX", "TMP_SUFFIX", "aside_of", "aside_path", "atomic_path", "clean_stale_temps", "fsync_path", "recover_aside",
           "remove", "replace", "resolve"]

logger = logging.getLogger(__name__)

TMP_SUFFIX = ".cs-run-tmp"
ASIDE_SUFFIX = ".cs-run-aside"
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
            remove(path)  # a file, or a sharded save's folder
            removed.append(path)
            logger.info("removed stale checkpoint temporary %s", path)
    return removed


def remove(path: str) -> None:
    """Remove a file or a folder (a temporary, a replaced or pruned checkpoint); errors are ignored."""
    with contextlib.suppress(OSError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def fsync_path(path: str, directory: bool = False) -> None:
    """fsync a file (its data and metadata) or a folder (its entries, e.g. after a rename)."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    fd = os.open(path or ".", flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str, folder_ok: bool = False) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success fsync it and put it at ``path`` (:func:`replace`;
    ``folder_ok``: also over a folder there, a sharded checkpoint of the same name).

    The caller writes the whole file (and its completion marker) to the yielded path. On any
    exception the temporary is removed and ``path`` is untouched.
    """
    folder, base = os.path.split(os.path.abspath(path))
    clean_stale_temps(folder)
    tmp = os.path.join(folder, f".{base}.{os.getpid()}.{secrets.token_hex(4)}{TMP_SUFFIX}")
    try:
        yield tmp
        fsync_path(tmp)
        replace(tmp, path, folder_ok=folder_ok)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def aside_path(final: str | os.PathLike) -> str:
    """Where :func:`replace` keeps the old checkpoint of ``final``'s name between its two renames."""
    folder, base = os.path.split(os.path.abspath(final))
    return os.path.join(folder, f".{base}{ASIDE_SUFFIX}")


def aside_of(name: str) -> str | None:
    """The checkpoint name whose aside (:func:`aside_path`) ``name`` is, or None when it is none."""
    if name.startswith(".") and name.endswith(ASIDE_SUFFIX) and len(name) > len(ASIDE_SUFFIX) + 1:
        return name[1:-len(ASIDE_SUFFIX)]
    return None


def resolve(path: str | os.PathLike) -> str:
    """The path a checkpoint named ``path`` is read from: ``path``, or its aside when a replacement was
    killed between its renames (nothing under ``path``, the old checkpoint whole under the aside)."""
    path = os.fspath(path)
    if not os.path.lexists(path) and os.path.lexists(aside := aside_path(path)):
        return aside
    return path


def recover_aside(final: str | os.PathLike) -> None:
    """Before a save to ``final``: an aside left by a killed :func:`replace` goes back to ``final`` when
    nothing is there (the old checkpoint, complete), or is removed when the new one was committed."""
    final = os.fspath(final)
    aside = aside_path(final)
    if not os.path.lexists(aside):
        return
    if os.path.lexists(final):
        remove(aside)
        return
    os.rename(aside, final)
    fsync_path(os.path.dirname(os.path.abspath(final)), directory=True)
    logger.warning("recovered checkpoint %s from %s (a save replacing it was stopped between its renames)",
                   final, aside)


def replace(tmp: str, final: str | os.PathLike, folder_ok: bool = True) -> None:
    """Put ``tmp`` (a finished file or folder, fsynced) at ``final``, replacing what is there, so that a
    complete checkpoint of that name is always reachable (:func:`resolve`). A file over a file (or over
    nothing) is one atomic rename; a folder, or anything over a folder, moves the old one to its aside name
    first and removes it last. ``folder_ok=False`` refuses a folder at ``final`` (IsADirectoryError)."""
    final = os.path.abspath(final)
    folder = os.path.dirname(final)
    recover_aside(final)
    if os.path.isdir(final) and not os.path.islink(final) and not folder_ok:
        raise IsADirectoryError(f"'{final}' is a directory")
    _launcher_watch.check_alive(f"checkpoint {final}")  # the last moment before the commit (LauncherGone)
    if not os.path.lexists(final) or not (os.path.isdir(tmp) or os.path.isdir(final)):
        os.replace(tmp, final)
        fsync_path(folder, directory=True)  # make the rename itself durable
        return
    aside = aside_path(final)
    os.rename(final, aside)
    fsync_path(folder, directory=True)  # the old one is whole under its aside name before the new one moves in
    os.rename(tmp, final)
    fsync_path(folder, directory=True)
    remove(aside)
