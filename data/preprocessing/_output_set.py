"""The output folder of ``cs-run data preprocess`` as one set switched by one rename.

A run's splits and tokenizer are one set: shards of one tokenizer. The folder holds every set in a
hidden folder and names the current one by a symlink, so one ``os.replace`` of that pointer switches
train, val and the tokenizer together, and a kill -9 at any instant leaves the old set or the new one
whole, never new shards beside an old tokenizer::

    OUTPUT_DIR/.set-<id>/{train/, val/, tokenizer.json}   # one whole set
    OUTPUT_DIR/.current -> .set-<id>                      # the pointer (replaced atomically)
    OUTPUT_DIR/train -> .current/train                    # fixed links: data_dir OUTPUT_DIR/train still
    OUTPUT_DIR/val -> .current/val                        #   works, and follows every switch
    OUTPUT_DIR/tokenizer.json -> .current/tokenizer.json

A folder written by an older cs-run (train/, val/, tokenizer.json as real entries) first becomes a set
of hard links to the same files; each real entry is then exchanged with its link in one
``renameat2(RENAME_EXCHANGE)``, so readers see the same bytes throughout. Where the kernel or the
filesystem cannot exchange, the entry is moved aside and the link put in its place (a moment when the
name is missing; the next run puts a missing link back). Staging folders and sets of killed runs are
removed by the next run; a folder a live run holds is locked (flock) and left alone.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["NAMES", "STAGING_PREFIX", "Staging", "clean_stale", "switch"]

logger = logging.getLogger(__name__)

NAMES = ("train", "val", "tokenizer.json")
"""What a set holds (val only when the run wrote one)."""
POINTER = ".current"
SET_PREFIX = ".set-"
STAGING_PREFIX = ".preprocess-"
_TEMP_PREFIX = ".link-"  # a symlink being made, renamed into place
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class Staging:
    """A fresh hidden folder in ``output_dir`` (the same filesystem, so it becomes a set by rename), held
    locked by this process until :meth:`close` so that another run's :func:`clean_stale` leaves it."""

    def __init__(self, output_dir: Path) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=output_dir))
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # the lock is the inode's: it stays with the folder's renames

    def close(self) -> None:
        if self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)


def _held(path: Path) -> bool:
    """Whether a live process holds ``path``'s lock (a killed one's lock went with it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _current(output_dir: Path) -> str | None:
    pointer = output_dir / POINTER
    return os.readlink(pointer) if pointer.is_symlink() else None


def clean_stale(output_dir: Path) -> None:
    """Remove what killed runs left (staging folders, sets no pointer names, half-made links) and put
    back a fixed link that a killed switch left missing."""
    if not output_dir.is_dir():
        return
    pointer = output_dir / POINTER
    if pointer.is_dir() and not pointer.is_symlink():  # a copy that followed the links (shutil.copytree, cp -L):
        shutil.rmtree(pointer)  # its real train/ (...) hold the data; the pointer's and the sets' copies go
    current = _current(output_dir)
    for entry in output_dir.iterdir():
        name = entry.name
        if name.startswith(_TEMP_PREFIX):  # a link being made, or a real entry exchanged out (the set holds its
            _remove(entry)                  # hard links)
        elif (name.startswith(STAGING_PREFIX) or (name.startswith(SET_PREFIX) and name != current)) \
                and entry.is_dir() and not entry.is_symlink() and not _held(entry):
            logger.info("data preprocess: removing %s (left by a run that did not finish)", entry)
            shutil.rmtree(entry, ignore_errors=True)
    if current is not None:
        for name in NAMES:
            if (output_dir / current / name).exists() and not os.path.lexists(output_dir / name):
                _link(output_dir, name, f"{POINTER}/{name}")


def _link(output_dir: Path, name: str, target: str) -> None:
    """``output_dir/name`` -> ``target`` made in one rename (a temporary link renamed over the name)."""
    temp = output_dir / f"{_TEMP_PREFIX}{name}-{os.getpid()}"
    if os.path.lexists(temp):
        temp.unlink()
    os.symlink(target, temp)
    os.replace(temp, output_dir / name)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where that is not supported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _adopt_legacy(output_dir: Path) -> None:
    """Make real train/, val/, tokenizer.json (an older cs-run's layout) part of the current set without
    changing a byte a reader sees: hard links in a set (the current one, if a killed adoption made it),
    the pointer, then each real entry exchanged with its link."""
    real = [n for n in NAMES if os.path.lexists(output_dir / n) and not (output_dir / n).is_symlink()]
    if not real:
        return
    current = _current(output_dir)
    adopting = output_dir / current if current and (output_dir / current).is_dir() else None
    legacy = adopting or Path(tempfile.mkdtemp(prefix=SET_PREFIX, dir=output_dir))
    for name in real:  # readers see the real entry: a copy a killed adoption left in the set is replaced
        source, part = output_dir / name, legacy / f"{_TEMP_PREFIX}{name}"
        _remove(part)
        if source.is_dir():
            shutil.copytree(source, part, copy_function=os.link)
        else:
            os.link(source, part)
        _remove(legacy / name)
        os.rename(part, legacy / name)
    if adopting is None:
        _link(output_dir, POINTER, legacy.name)
    for name in real:
        temp = output_dir / f"{_TEMP_PREFIX}{name}-{os.getpid()}"
        os.symlink(f"{POINTER}/{name}", temp)
        if not _exchange(temp, output_dir / name):
            aside = output_dir / f"{_TEMP_PREFIX}{name}-{os.getpid()}-old"
            os.rename(output_dir / name, aside)  # the name is missing until the next line (clean_stale repairs)
            os.rename(temp, output_dir / name)
            temp = aside
        _remove(temp)


def switch(output_dir: Path, staging: Path) -> None:
    """Make the whole set in ``staging`` the output in one rename of the pointer; the old set is removed.

    Raises:
        OSError: before the switch (the old set is still the output, unchanged as readers see it).
    """
    _adopt_legacy(output_dir)
    new_set = staging.with_name(SET_PREFIX + staging.name[len(STAGING_PREFIX):])
    os.rename(staging, new_set)
    names = [n for n in NAMES if os.path.lexists(new_set / n)]
    made = []
    try:
        for name in names:  # a link that dangles until the switch (the old set has no val) shows nothing
            if not os.path.lexists(output_dir / name):
                _link(output_dir, name, f"{POINTER}/{name}")
                made.append(name)
        _link(output_dir, POINTER, new_set.name)  # the switch
    except OSError:
        for name in made:
            (output_dir / name).unlink(missing_ok=True)
        os.rename(new_set, staging)  # removed with the staging folder
        raise
    try:  # after the switch nothing may fail the run: what is left here the next run removes
        for name in NAMES:
            if name not in names and (output_dir / name).is_symlink():
                (output_dir / name).unlink()
        for entry in output_dir.glob(f"{SET_PREFIX}*"):  # the old set, and sets of killed runs
            if entry.name != new_set.name and entry.is_dir() and not entry.is_symlink() and not _held(entry):
                shutil.rmtree(entry)
    except OSError as e:
        logger.warning("data preprocess: the new output is in place; removing the old set failed (%s): the next "
                       "run removes it", e)
