"""The cs-run H5 checkpoint format, version 1: the spec, its constants and the dtype tables.

A checkpoint is one HDF5 file: superblock 0, a symbol-table root group and version-1 object headers,
the structures libhdf5 writes with ``libver="earliest"``, encoded directly by
:mod:`cs_run.checkpoint.h5_encoder` (compressed checkpoints are written by h5py instead). Tensor data
starts on 64-byte boundaries and nothing records a time, so the same state always gives the same bytes.

File attributes
    ``__format__``          ``"cs_run.checkpoint"``: tells our files from the vendor's legacy layout.
    ``__format_version__``  integer, currently ``1``. A reader refuses a file with a larger number.
    ``__structure__``       UTF-8 JSON, the structure spec and leaf index (below).
    ``__structure_crc32__`` zlib.crc32 of the ``__structure__`` bytes (a damaged spec is reported, not
                            half-parsed).
    ``__complete__``        ``1``; the success marker, set after every dataset and the spec are written
                            and fsynced. A file without it is "incomplete" and is never loaded.
    A shard of a sharded checkpoint (:mod:`cs_run.checkpoint.sharded`) also carries its save's identity:
    ``__checkpoint_id__``   the save's random id (32 hex digits), the same in every shard and the index.
    ``__checkpoint_step__`` integer, the saved global step (-1 when the state records none).
    ``__shard_rank__``      integer, which shard of the save this file is.

Datasets
    One dataset per leaf, directly under the root group, named after the leaf's *flattened key*: the
    path of dict keys and list/tuple indices joined with ``.`` (``optimizer.state.0.exp_avg``). In the
    name, ``%`` becomes ``%25``, ``/`` becomes ``%2F``, ``.`` / ``..`` / the empty root key are spelled
    ``%2E`` / ``%2E%2E`` / ``%00``, NUL is ``%00`` too, and a name already taken (``{"a.b": x, "a": {"b": y}}``) gets a
    ``%~N`` suffix. Readers never parse names: the spec maps each leaf to its dataset.
    Every dataset has one attribute, ``__type__`` (see :data:`LEAF_TYPES`): ``torch.<dtype>`` for a
    tensor, ``ndarray``, ``npscalar``, ``int``, ``float``, ``bool``, ``complex``, ``str``, ``bytes``,
    ``none`` or ``pickle``.
    Tensor and array data is stored contiguous and uncompressed by default (so it can be memory-mapped
    at its file offset); ``compression=`` switches to chunked, compressed storage. Dtypes numpy lacks
    are stored as their bit pattern in an unsigned integer of the same width (bfloat16 as uint16, float8
    as uint8, complex32 as uint32); the ``__type__`` attribute names the real dtype (the "bf16 flag").
    Python ints outside int64 are stored as decimal strings; None as an empty dataset; strings as
    variable-length UTF-8 (its UTF-8 bytes as a uint8 vector when it contains NUL, which HDF5 strings
    cannot hold; the value itself is read from the spec); bytes as a uint8 vector; pickled objects
    (opt-in only) as a uint8 vector.

Structure spec (``__structure__``)
    ``{"tree": NODE, "leaves": [LEAF, ...]}``. A NODE is an integer (index into ``leaves``) or one of
    ``{"dict": [[KEY, NODE], ...]}``, ``{"odict": [[KEY, NODE], ...], "meta": {...}}`` (an OrderedDict;
    ``meta`` keeps a state dict's ``_metadata``), ``{"list": [NODE, ...]}``, ``{"tuple": [NODE, ...]}``.
    A KEY is a JSON string for a str key, else ``["int", 3]``, ``["float", 0.5]``, ``["bool", true]``
    or ``["none", null]``.
    A LEAF has ``key`` (flattened key), ``ds`` (dataset name), ``type`` (as ``__type__``) and, as they
    apply: ``shape``, ``dtype`` (ndarray/npscalar: numpy dtype string), ``off`` (byte offset of the
    contiguous data in the file, null when compressed or empty), ``n`` (data bytes), ``crc`` (zlib.crc32
    of the data bytes), ``v`` (the value of a JSON-safe scalar, a cache of the dataset), ``param`` /
    ``rg`` (nn.Parameter, requires_grad), ``cls`` (class name of a pickled object).

Tied tensors
    Tensors that are the same view of the same storage (same data pointer, offset, shape, strides and
    dtype, e.g. tied embedding weights) are stored once; the later leaves get ``"tied": i`` (the index
    of the first leaf), no data, and a hard link under their own dataset name. Loading returns one
    tensor object for all of them. Distinct views that only overlap are stored as separate copies.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "ALIGNMENT",
    "ATTR_CHECKPOINT_ID",
    "ATTR_CHECKPOINT_STEP",
    "ATTR_COMPLETE",
    "ATTR_FORMAT",
    "ATTR_SHARD_RANK",
    "ATTR_STRUCTURE",
    "ATTR_STRUCTURE_CRC",
    "ATTR_TYPE",
    "ATTR_VERSION",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "LEAF_TYPES",
    "TORCH_DTYPES",
    "dataset_name",
    "sniff",
    "torch_dtype_name",
]

FORMAT_NAME = "cs_run.checkpoint"
FORMAT_VERSION = 1

ATTR_FORMAT = "__format__"
ATTR_VERSION = "__format_version__"
ATTR_STRUCTURE = "__structure__"
ATTR_STRUCTURE_CRC = "__structure_crc32__"
ATTR_COMPLETE = "__complete__"
ATTR_TYPE = "__type__"
ATTR_CHECKPOINT_ID = "__checkpoint_id__"  # shards of a sharded checkpoint only
ATTR_CHECKPOINT_STEP = "__checkpoint_step__"
ATTR_SHARD_RANK = "__shard_rank__"

# Every dataset starts on a 64-byte boundary, so a memory-mapped tensor is aligned for any dtype/SIMD.
ALIGNMENT = 64

LEAF_TYPES = ("ndarray", "npscalar", "int", "float", "bool", "complex", "str", "bytes", "none", "pickle")


def _build_torch_dtypes() -> dict[str, tuple[torch.dtype, np.dtype, torch.dtype | None]]:
    """name -> (torch dtype, numpy storage dtype, bit-pattern view dtype or None when numpy has it)."""
    native = [
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    ]
    table: dict[str, tuple[torch.dtype, np.dtype, torch.dtype | None]] = {}
    for name in native:
        if hasattr(torch, name):
            table[name] = (getattr(torch, name), np.dtype(name), None)
    bits = {
        "bfloat16": (np.uint16, torch.int16),
        "complex32": (np.uint32, torch.int32),
        "float8_e4m3fn": (np.uint8, torch.uint8),
        "float8_e4m3fnuz": (np.uint8, torch.uint8),
        "float8_e5m2": (np.uint8, torch.uint8),
        "float8_e5m2fnuz": (np.uint8, torch.uint8),
        "float8_e8m0fnu": (np.uint8, torch.uint8),
    }
    for name, (np_dtype, view) in bits.items():
        if hasattr(torch, name):
            table[name] = (getattr(torch, name), np.dtype(np_dtype), view)
    return table


# Like safetensors' _TYPES: the one place that says how each torch dtype is laid out on disk.
TORCH_DTYPES = _build_torch_dtypes()
_NAME_OF = {dt: name for name, (dt, _, _) in TORCH_DTYPES.items()}


def torch_dtype_name(dtype: torch.dtype) -> str | None:
    """The table name of a torch dtype, or None when the format cannot store it."""
    return _NAME_OF.get(dtype)


def dataset_name(key: str) -> str:
    """The dataset name for a flattened key (escaping only what HDF5 cannot take as a name)."""
    name = key.replace("%", "%25").replace("/", "%2F").replace("\x00", "%00")
    if name == "":
        return "%00"
    if name in (".", ".."):
        return name.replace(".", "%2E")
    return name


_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def sniff(head: bytes) -> str:
    """Guess a file's format from its first 16 bytes: "h5", "torch", "safetensors" or "unknown"."""
    if head.startswith(_HDF5_MAGIC):
        return "h5"
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":  # torch zip archive / legacy pickle
        return "torch"
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < (1 << 30):
        return "safetensors"
    return "unknown"
