"""A Hugging Face model folder as files: telling one from a checkpoint, reading its ``config.json`` without
trusting it, the tokenizer and generation files that travel with the weights, and replacing a whole folder
in one step.

``config.json`` comes from elsewhere: a FIFO or device under that name would block the read forever, a
huge file would fill the memory and a deeply nested one overflows Python's JSON parser (RecursionError),
so each is one error naming the file. A folder is replaced the way :mod:`cs_run.checkpoint.atomic`
replaces a checkpoint: the whole new folder is written under a temporary name in the same parent, then
renamed in (the old one moved aside first and removed last), so a failure at any point leaves the old
folder whole, and the new one holds only files of the new model.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cs_run.checkpoint import atomic
from cs_run.checkpoint.reader import one_line
from cs_run.errors import CheckpointError

__all__ = ["TOKENIZER_FILES", "GENERATION_CONFIG", "is_hf_folder", "read_config", "side_files", "copy_side_files",
           "replaced_folder"]

# What transformers' tokenizers save beside a model (save_pretrained), fast and slow forms.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt", "chat_template.jinja")
GENERATION_CONFIG = "generation_config.json"
_MAX_CONFIG_BYTES = 16 << 20  # a config.json of real models is a few KiB


def is_hf_folder(path: str | os.PathLike) -> bool:
    """A folder holding ``config.json`` and no sharded-checkpoint index: a Hugging Face model folder."""
    path = Path(path)
    return path.is_dir() and os.path.lexists(path / "config.json") and not (path / "index.json").exists()


def read_config(path: str | os.PathLike, what: str = "Hugging Face config",
                max_bytes: int = _MAX_CONFIG_BYTES) -> dict[str, Any]:
    """The JSON object in ``path`` (a ``config.json``, ``tokenizer_config.json``, ...; ``max_bytes``: larger
    for a ``tokenizer.json``, which holds the vocabulary).

    Raises:
        CheckpointError: one line naming the file: missing, not a regular file, too large, not JSON, nested
            too deeply, or not an object.
    """
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO or a device would block or never end
        raise CheckpointError(f"{path}: not a regular file; a {what} is a JSON file")
    if st.st_size > max_bytes:
        raise CheckpointError(f"{path}: {st.st_size} bytes; a {what} is at most {max_bytes >> 20} MiB")
    try:
        with open(path, "rb") as fh:
            cfg = json.loads(fh.read(max_bytes + 1))
    except RecursionError:
        raise CheckpointError(f"{path}: nested too deeply to be a {what}; give the file written with the "
                              "model") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({one_line(e)})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: expected a JSON object of settings, got {type(cfg).__name__}")
    return cfg


def side_files(folder: str | os.PathLike) -> list[Path]:
    """The tokenizer files and the generation config in ``folder``, regular files only."""
    folder = Path(folder)
    return [folder / name for name in (*TOKENIZER_FILES, GENERATION_CONFIG) if (folder / name).is_file()]


def copy_side_files(files: list[Path], dst_folder: str | os.PathLike) -> list[Path]:
    """Copy ``files`` into ``dst_folder`` (each written atomically); returns the copies."""
    out = []
    for src in files:
        dst = Path(dst_folder) / src.name
        try:
            with atomic.atomic_path(str(dst)) as tmp:
                shutil.copyfile(src, tmp)
        except OSError as e:
            raise CheckpointError(f"cannot copy {src} to {dst}: {e.strerror or e}") from None
        out.append(dst)
    return out


@contextlib.contextmanager
def replaced_folder(dst: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``dst``; when the block ends without an error it becomes
    ``dst``, replacing what was there (file or folder) with :func:`cs_run.checkpoint.atomic.replace`; on an
    error it is removed and ``dst`` is as it was. Temporaries of killed runs in that parent are removed
    first, and an old folder a killed replacement left aside is put back."""
    dst = Path(dst).absolute()
    parent = dst.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        atomic.recover_aside(dst)
    except OSError as e:
        raise CheckpointError(f"cannot write {dst}: {e.strerror or e}") from None
    with atomic.atomic_path(str(dst), folder_ok=True) as tmp:  # also cleans the stale temporaries of parent
        try:
            os.mkdir(tmp)
            yield Path(tmp)
            for name in os.listdir(tmp):
                atomic.fsync_path(os.path.join(tmp, name))
        except BaseException:
            atomic.remove(tmp)
            raise
