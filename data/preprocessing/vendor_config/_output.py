"""The vendor's output folder: ``output_chunk_*.h5`` files and ``data_params.json``, written staged.

Layout (Release 2.10's DataPreprocessor with ``processes: 1``, no shuffle): samples are buffered per
read chunk and written to ``output_chunk_0_<n>.h5`` when the buffer reaches ``write_chunk_size`` bytes
(``<n>``: the read chunk that filled it) and at the end (``<n>``: the number of read chunks); packed
pretraining's carried rest goes to ``output_chunk_1_prefix.h5``. Each file holds one dataset ``data``
(N x 3 x max_seq_length, i4, gzip, chunks of one sample; a masked LM's N x 2 x msl and ``labels`` beside it)
and the attribute ``n_examples``.
data_params.json is the config as read, with processing.eos_id / pad_id / vocab_size, ``features`` and
the ``post-process`` counts (keys sorted, indent 4, as the vendor writes it).

With ``processing.shuffle`` the files are the vendor's shuffled layout instead: ``output_chunk_<k>.h5``, k in
``range(ceil(input bytes / write_chunk_size))`` (.json.gz, .parquet and .jsonl.zst counted 3 times their size), the
rows of each read chunk dealt to them by one draw each, appended (resizable datasets), then each file's rows
permuted (:meth:`Output.append_h5`, :meth:`Output.shuffle_files`).

Everything is written into a hidden staging folder inside the output folder and moved into place only
when the whole run succeeded (data_params.json last): a failure or a kill leaves what was there before.
A killed run's staging folder is removed by the next run (a live run's is locked and left alone).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import sys
import tempfile
from typing import Optional

import numpy as np

from cs_run.errors import DataError, ParamsError

__all__ = ["Output", "buffer_size", "check_output_dir", "stack"]

STAGING_PREFIX = ".preprocess-"


def _nested_size(arr: np.ndarray) -> int:
    """sys.getsizeof of an array plus, recursively, of every row view and element it iterates into: the
    vendor's get_size, which decides when a buffer is written out (closed form per dimension)."""
    def below(shape: tuple[int, ...]) -> int:
        if not shape:
            return sys.getsizeof(arr.dtype.type(0))
        view = np.empty(shape + (1,), dtype=arr.dtype)[..., 0]  # a non-owning array of this ndim
        return sys.getsizeof(view) + shape[0] * below(shape[1:])
    return sys.getsizeof(arr) + (arr.shape[0] * below(arr.shape[1:]) if arr.ndim else 0)


def stack(samples: list) -> tuple[np.ndarray, ...]:
    """One read chunk's samples as one array per h5 key (a sample is an array, or a tuple of one per key)."""
    if isinstance(samples[0], np.ndarray):
        return (np.stack(samples),)
    return tuple(np.stack(column) for column in zip(*samples))


def buffer_size(buffer: list[tuple[np.ndarray, ...]], keys: tuple[str, ...] = ("data",)) -> int:
    """The vendor's get_size of its write buffer ``{key: [one array per read chunk], ...}``."""
    held: dict = {}
    for key in keys:  # filled one key at a time, as the vendor's dict is (its size follows its growth)
        held[key] = None
    lists = [[chunk[i] for chunk in buffer] for i in range(len(keys))]  # grown by append, as the vendor's lists
    return (sys.getsizeof(held) + sum(sys.getsizeof(k) for k in keys) + sum(sys.getsizeof(x) for x in lists)
            + sum(_nested_size(a) for chunk in buffer for a in chunk))


def _typed(data: np.ndarray) -> tuple[np.ndarray, object]:
    """An array and the h5 type the vendor stores it as: byte strings as UTF-8 strings, bools as bools, the rest i4."""
    import h5py

    if data.dtype.kind == "S":
        return data, h5py.string_dtype(encoding="utf-8")
    if data.dtype == np.bool_:
        return data, np.bool_
    return data.astype(np.int32, copy=False), "i4"


def check_output_dir(output_dir: str, where: str) -> None:
    """Refuse an output folder that already holds a preprocessing run (nothing there is replaced unasked)."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ParamsError(f"data preprocess --config: setup.output_dir {output_dir} is a file ({where}); give a folder")
    if not os.path.isdir(output_dir):
        return
    held = sorted(n for n in os.listdir(output_dir) if n == "data_params.json" or (n.endswith(".h5")))
    if held:
        raise ParamsError(f"data preprocess --config: setup.output_dir {output_dir} already holds {', '.join(held[:3])} "
                          f"({where}); choose another output_dir or move them away")


def _clean_stale(output_dir: str) -> None:
    """Remove the staging folders of killed runs (a live run holds its folder's lock and is left alone)."""
    for name in os.listdir(output_dir):
        path = os.path.join(output_dir, name)
        if not name.startswith(STAGING_PREFIX) or not os.path.isdir(path) or os.path.islink(path):
            continue
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)


def finished_run(output_dir: str) -> Optional[tuple[list[str], int, int]]:
    """(the .h5 files, n_examples, vocab_size) of the finished run in ``output_dir``, or None when there is none."""
    path = os.path.join(output_dir, "data_params.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            params = json.load(f)
        n, vocab = params["post-process"]["n_examples"], params["processing"]["vocab_size"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ParamsError(f"data preprocess --config: {path} is not the data_params.json of a finished run ({e!r}); "
                          "move the folder away or choose another output_dir") from None
    return sorted(n for n in os.listdir(output_dir) if n.endswith(".h5")), n, vocab


class Output:
    """A staging folder that becomes the output files on :meth:`commit`."""

    def __init__(self, output_dir: str, params: dict) -> None:
        self.output_dir = output_dir
        self.params = params
        try:
            os.makedirs(output_dir, exist_ok=True)
            _clean_stale(output_dir)
            self.stage = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=output_dir)
            self._fd = os.open(self.stage, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # held until close: another run's clean-up leaves this folder
        except OSError as e:
            raise ParamsError(f"data preprocess --config: cannot write to setup.output_dir {output_dir} "
                              f"({e.strerror or e}); choose a writable folder") from None
        self.names: list[str] = []

    def write_h5(self, name: str, chunks: list[tuple[np.ndarray, ...]], keys: tuple[str, ...] = ("data",)) -> None:
        """One output file of the buffered read chunks: a dataset per key (``data`` N x 3 x msl; a masked LM's
        ``data`` N x 2 x msl and ``labels``)."""
        import h5py

        with h5py.File(os.path.join(self.stage, name), "w") as f:
            for i, key in enumerate(keys):
                data, dtype = _typed(np.concatenate([chunk[i] for chunk in chunks]))
                f.create_dataset(key, data=data, dtype=dtype, chunks=(1, *data.shape[1:]), compression="gzip")
            f.attrs["n_examples"] = data.shape[0]
        self.names.append(name)

    def append_h5(self, name: str, rows, keys: tuple[str, ...] = ("data",)) -> None:
        """Append ``rows`` (an array, or one per key) to the shuffled layout's file ``name`` (created resizable
        along the samples, as the vendor's append_df_to_hdf5 creates it)."""
        import h5py

        columns = (rows,) if isinstance(rows, np.ndarray) else tuple(rows)
        with h5py.File(os.path.join(self.stage, name), "a") as f:
            f.attrs["n_examples"] = f.attrs.get("n_examples", 0) + len(columns[0])
            for key, column in zip(keys, columns):
                column, dtype = _typed(column)
                if key not in f:
                    f.create_dataset(key, data=column, dtype=dtype, chunks=(1, *column.shape[1:]),
                                     maxshape=(None, *column.shape[1:]), compression="gzip")
                else:
                    data = f[key]
                    old = data.shape[0]
                    data.resize((old + len(column), *data.shape[1:]))
                    data[old:] = column
        if name not in self.names:
            self.names.append(name)

    def shuffle_files(self, seed: int) -> None:
        """The vendor's second pass: the files in name order, the i-th one's rows permuted by
        ``np.random.seed(seed + i); np.random.shuffle(arange(n))``."""
        import h5py

        for i, name in enumerate(sorted(n for n in self.names if n.endswith(".h5"))):
            with h5py.File(os.path.join(self.stage, name), "r+") as f:
                order = np.arange(f[next(iter(f.keys()))].shape[0])
                np.random.RandomState(seed + i).shuffle(order)
                for key in f.keys():  # one order for every dataset of the file
                    data = f[key]
                    data[...] = data[:][order]

    def write_params(self, extra_processing: dict, features: list[str], stats: dict) -> None:
        """data_params.json: the config, the ids the run used, and the post-process counts."""
        params = json.loads(json.dumps(self.params))
        params.setdefault("dataset", {})  # the vendor writes the section, empty where the config has none
        params["processing"].update(extra_processing)
        params["features"] = features
        post = dict(stats)
        n = post.get("n_examples", 0)
        post["average_chars_per_sequence"] = math.ceil(post["raw_chars_count"] / n) if n else 0
        post["average_bytes_per_sequence"] = math.ceil(post["raw_bytes_count"] / n) if n else 0
        if post.get("num_sequences_before_packing"):  # use_vsl: sequences per written sample, as the vendor rounds it
            post["vsl_packing_factor"] = round(post["num_sequences_before_packing"] / n, 2)
        params["post-process"] = post
        with open(os.path.join(self.stage, "data_params.json"), "w") as f:
            json.dump(params, f, indent=4, sort_keys=True)
        self.names.append("data_params.json")

    def commit(self) -> None:
        """Move the staged files into the output folder, data_params.json last (it marks a whole run)."""
        for name in sorted(self.names, key=lambda n: n == "data_params.json"):
            os.replace(os.path.join(self.stage, name), os.path.join(self.output_dir, name))
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.stage, ignore_errors=True)
        os.close(self._fd)


def write_failed(output_dir: str, e: OSError) -> DataError:
    why = f"[Errno {e.errno}] {e.strerror}" if e.errno else str(e)
    return DataError(f"data preprocess --config: writing the output into {output_dir} failed ({why}); nothing in it "
                     "was changed (free space or choose another output_dir)")
