"""Local text files -> Model Zoo GPT HDF5 shards, with a byte-level BPE tokenizer trained here.

Follows the Model Zoo's ``hdf5_preprocessing`` LM writer (Release 1.9 ``LMDataPreprocessor`` with
``pack_sequences``): each document is tokenized and ends with the end-of-text token; the token stream
is cut into windows of ``max_seq_length + 1`` tokens overlapping by one (inputs = window[:-1],
labels = window[1:]); a document's short tail carries over into the next one; the last sample is
padded with ``pad_id`` and a zero loss mask. Shards are ``examples_<n>.h5`` holding int32
``data[n_examples, 3, max_seq_length]`` in one-sample gzip chunks with an ``n_examples`` attribute.

Nothing is downloaded: the tokenizer is trained on the training documents with the ``tokenizers``
package (``pip install 'cs-run[text]'``) or read from a ``tokenizer.json`` given by path.

Every input is checked to be UTF-8 text before anything is written. Output is written into a hidden
staging folder inside the output folder and switched in at the end as one set (train, val and the
tokenizer by one rename, :mod:`._output_set`), so a failure or a kill -9, ``--overwrite`` or not,
leaves the old output or the new one, whole. Each
shard records the largest token id it holds (``max_token_id``) and a Fletcher-32 checksum per chunk,
so a reader refuses ids the model cannot embed before the first step, and damaged bytes by name.
"""

from __future__ import annotations

import io
import json
import logging
import random
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

import h5py  # noqa: TID253 - this data module reads and writes HDF5 files; loaded only by data preprocess
import numpy as np
from tqdm import tqdm

from cs_run.data.preprocessing import _output_set
from cs_run.errors import DataError, ParamsError

__all__ = ["PreprocessResult", "collect_documents", "stdlib_documents", "check_documents", "load_or_train_tokenizer",
           "pack_samples", "ShardWriter", "preprocess"]

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
FEATURES = ["input_ids", "attention_mask", "labels"]
_ENCODE_CHUNK = 64  # documents per encode_batch call
_OURS = ("*.h5", "data_params.json")  # what a split folder of ours holds (replaced as a whole)


def stdlib_documents() -> list[Path]:
    """The running Python's own top-level standard library modules (sources and docstrings): a corpus
    every machine with Python has. Sorted, so one Python version gives one corpus."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py") if p.is_file())


def collect_documents(inputs: Iterable[str | Path], patterns: tuple[str, ...] = ("*.txt",)) -> list[Path]:
    """Files given directly, plus the files matching ``patterns`` under given folders (recursively)."""
    found: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            matches = sorted({p for pattern in patterns for p in path.rglob(pattern) if p.is_file()})
            if not matches:
                raise ParamsError(f"data preprocess: no files matching {', '.join(patterns)} in {path} "
                                  "(set --pattern)")
            found.extend(matches)
        elif path.exists():  # a FIFO or a device such as /dev/zero: no end to read to
            raise ParamsError(f"data preprocess: input {path} is not a regular file or a folder")
        else:
            raise ParamsError(f"data preprocess: input {path} does not exist")
    return found


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ParamsError("data preprocess: the 'tokenizers' package is not installed; "
                          "pip install 'cs-run[text]' (it trains the tokenizer and reads --tokenizer files)") from None
    return tokenizers


def load_or_train_tokenizer(tokenizer_path: Optional[Path], train_files: list[Path], vocab_size: int,
                            save_to: Path):
    """An existing ``tokenizer.json``, or a byte-level BPE trained on ``train_files`` and saved to ``save_to``."""
    tokenizers = _tokenizers()
    if tokenizer_path is not None:
        try:
            tok = tokenizers.Tokenizer.from_file(str(tokenizer_path))
        except Exception as e:  # noqa: BLE001 - the library raises plain Exceptions for bad files
            raise ParamsError(f"data preprocess: --tokenizer {tokenizer_path}: not a tokenizers JSON file ({e})") \
                from None
        return tok
    if vocab_size < 257:
        raise ParamsError(f"data preprocess: --vocab_size {vocab_size} is too small for a byte-level BPE (>= 257)")
    bpe = tokenizers.ByteLevelBPETokenizer()
    logger.info("training a byte-level BPE tokenizer (vocab %d) on %d files", vocab_size, len(train_files))
    # the trainer reads the files itself: check_documents has made sure that they are UTF-8 text
    bpe.train([str(p) for p in train_files], vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS_TOKEN],
              show_progress=False)
    save_to.parent.mkdir(parents=True, exist_ok=True)
    try:
        bpe.save(str(save_to))
    except Exception as e:  # noqa: BLE001 - the Rust side raises plain Exceptions for I/O errors
        raise OSError(f"{save_to}: {e}") from None
    return tokenizers.Tokenizer.from_file(str(save_to))


def _sample(window: list[int], msl: int, pad_id: int) -> np.ndarray:
    inputs, labels = window[:-1], window[1:]
    out = np.full((3, msl), pad_id, dtype=np.int32)
    out[0, :len(inputs)] = inputs
    out[1] = 0
    out[1, :len(inputs)] = 1
    out[2, :len(labels)] = labels
    return out


def pack_samples(token_docs: Iterable[list[int]], msl: int, eos_id: int, pad_id: int) -> Iterator[np.ndarray]:
    """Model Zoo packing: windows of msl + 1 tokens stepping by msl; tails carry into the next document;
    the final tail (>= 2 tokens) is padded."""
    prefix: list[int] = []
    for ids in token_docs:
        stream = prefix + list(ids) + [eos_id]
        start = 0
        while len(stream) - start >= msl + 1:
            yield _sample(stream[start:start + msl + 1], msl, pad_id)
            start += msl
        prefix = stream[start:]
    if len(prefix) >= 2:
        yield _sample(prefix, msl, pad_id)


class ShardWriter:
    """Writes samples into ``<name>_<n>.h5`` files of ``per_file`` samples each (the last may be smaller)."""

    def __init__(self, folder: Path, msl: int, per_file: int, name: str = "examples") -> None:
        self.folder, self.msl, self.per_file, self.name = folder, msl, per_file, name
        self.buffer: list[np.ndarray] = []
        self.files: list[Path] = []
        self.n_examples = 0
        folder.mkdir(parents=True, exist_ok=True)

    def add(self, sample: np.ndarray) -> None:
        self.buffer.append(sample)
        if len(self.buffer) == self.per_file:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        path = self.folder / f"{self.name}_{len(self.files)}.h5"
        data = np.stack(self.buffer)
        image = io.BytesIO()  # built in memory, then written by Python: libhdf5 crashes on a full disk
        with h5py.File(image, "w") as f:
            f.attrs["n_examples"] = len(self.buffer)
            # read by GptHDF5Dataset: a model.vocab_size <= this is refused before the first step
            f.attrs["max_token_id"] = int(data[:, [0, 2]].max())
            # fletcher32: a damaged chunk is a read error naming the shard, not wrong tokens
            f.create_dataset("data", data=data, dtype="i4", chunks=(1, 3, self.msl), compression="gzip",
                             fletcher32=True)
        path.write_bytes(image.getbuffer())
        self.files.append(path)
        self.n_examples += len(self.buffer)
        self.buffer = []


@dataclass
class PreprocessResult:
    tokenizer_path: Path
    vocab_size: int
    splits: dict  # split -> (n_examples, n_files, n_documents)


def _read(path: Path) -> str:
    """The text of ``path``; a file that is not UTF-8 text (binary, latin-1, UTF-16, ...) is an error naming it."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ParamsError(f"data preprocess: cannot read input {path} ({e.strerror or e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ParamsError(f"data preprocess: input {path} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                          f"{e.start}, line {line}); convert it (e.g. iconv -f latin1 -t utf-8) or leave it out"
                          ) from None
    nul = raw.find(b"\0")
    if nul >= 0:  # valid UTF-8 but binary (no text file holds NUL)
        raise ParamsError(f"data preprocess: input {path} is binary, not text (a NUL byte at offset {nul}); "
                          "leave it out (--pattern, or give the text files only)")
    return text


def check_documents(documents: list[Path]) -> list[Path]:
    """``documents`` without the empty ones, after checking that every one is readable UTF-8 text.

    Raises:
        ParamsError: naming the first document that is unreadable, binary or not UTF-8, or when all are empty.
    """
    kept = [p for p in documents if _read(p)]
    if len(kept) < len(documents):
        logger.info("data preprocess: %d empty document(s) left out", len(documents) - len(kept))
    if not kept:
        raise ParamsError(f"data preprocess: the {len(documents)} input document(s) are all empty")
    return kept


def _write_split(name: str, docs: list[Path], folder: Path, tok, msl: int, eos_id: int, per_file: int,
                 progress: bool) -> tuple[int, int]:
    writer = ShardWriter(folder, msl, per_file)

    def encoded() -> Iterator[list[int]]:
        with tqdm(total=len(docs), desc=f"Tokenize {name}", unit="file", disable=not progress) as bar:
            for i in range(0, len(docs), _ENCODE_CHUNK):
                part = docs[i:i + _ENCODE_CHUNK]
                for enc in tok.encode_batch([_read(p) for p in part]):
                    yield enc.ids
                bar.update(len(part))

    for sample in pack_samples(encoded(), msl, eos_id, eos_id):
        writer.add(sample)
    writer.flush()
    if writer.n_examples == 0:
        raise ParamsError(f"data preprocess: the {name} documents gave no sample of {msl} tokens; add text or "
                          "lower --max_seq_length")
    meta = {"features": FEATURES, "max_seq_length": msl, "n_examples": writer.n_examples,
            "n_files": len(writer.files), "n_documents": len(docs), "eos_id": eos_id, "pad_id": eos_id,
            "vocab_size": tok.get_vocab_size()}
    (folder / "data_params.json").write_text(json.dumps(meta, indent=2) + "\n")
    return writer.n_examples, len(writer.files)


def _check_output(output_dir: Path, tokenizer_path: Optional[Path], overwrite: bool) -> None:
    """Refuse what would replace earlier output unasked, or lose a file that is not ours. Every split of
    the old set counts: the new set replaces the old one whole (an old val is not kept beside new train)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise ParamsError(f"data preprocess: --output_dir {output_dir} is a file; give a folder")
    for split in ("train", "val"):
        folder = output_dir / split
        if not folder.exists():
            continue
        if not folder.is_dir():
            raise ParamsError(f"data preprocess: {folder} is a file, where the {split} shards go; move it away")
        foreign = sorted(p.name for p in folder.iterdir() if not any(p.match(g) and p.is_file() for g in _OURS))
        if foreign:
            raise ParamsError(f"data preprocess: {folder} holds {', '.join(foreign[:3])}, which is not a shard of "
                              "this command (the folder is replaced as a whole); move it away or use another "
                              "--output_dir")
        if any(folder.glob("*.h5")) and not overwrite:
            raise ParamsError(f"data preprocess: {folder} already holds *.h5 shards; use another --output_dir "
                              "or --overwrite")
    saved = output_dir / "tokenizer.json"
    same = tokenizer_path is not None and saved.is_file() and tokenizer_path.read_bytes() == saved.read_bytes()
    if saved.exists() and not overwrite and not same:
        raise ParamsError(f"data preprocess: {saved} already exists; use another --output_dir, --overwrite, "
                          f"or --tokenizer {saved} to keep it")


def _staging(output_dir: Path) -> _output_set.Staging:
    """A fresh hidden folder inside ``output_dir`` (same filesystem: it becomes the new set by rename), after
    removing what killed runs left there."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        _output_set.clean_stale(output_dir)
        return _output_set.Staging(output_dir)
    except OSError as e:
        raise ParamsError(f"data preprocess: cannot write to --output_dir {output_dir} ({e.strerror or e}); "
                          "choose a writable folder") from None


def preprocess(documents: list[Path], output_dir: Path, max_seq_length: int, *, vocab_size: int = 8192,
               tokenizer_path: Optional[Path] = None, eval_fraction: float = 0.0, files_per_record: int = 4096,
               seed: int = 0, overwrite: bool = False, progress: bool = True) -> PreprocessResult:
    """Tokenize ``documents`` into ``output_dir/train`` (and ``output_dir/val``) shards.

    Documents are split by file: a seeded shuffle puts ``eval_fraction`` of them (at least one) in val.
    ``output_dir/tokenizer.json`` is the shards' tokenizer (trained here, or a copy of ``tokenizer_path``);
    the three are one set, switched in by one rename, the old set's files removed.

    Raises:
        ParamsError: bad arguments, no documents, a document that is not UTF-8 text, an output folder
            that cannot be written, or shards already in an output folder (without ``overwrite``:
            nothing written before is replaced unasked).
        DataError: writing the output failed (a full disk); the old output is unchanged.
    """
    if max_seq_length < 2:
        raise ParamsError(f"data preprocess: --max_seq_length must be >= 2, got {max_seq_length}")
    if files_per_record < 1:
        raise ParamsError(f"data preprocess: --files_per_record must be >= 1, got {files_per_record}")
    if not 0.0 <= eval_fraction < 1.0:
        raise ParamsError(f"data preprocess: --eval_fraction must be in [0, 1), got {eval_fraction}")
    if not documents:
        raise ParamsError("data preprocess: no input documents (give files or folders, or --stdlib)")
    docs = check_documents(list(documents))
    random.Random(seed).shuffle(docs)
    n_val = max(1, round(len(docs) * eval_fraction)) if eval_fraction > 0 else 0
    if n_val >= len(docs):
        raise ParamsError(f"data preprocess: {len(docs)} document(s) cannot be split into train and val; "
                          "give more files or --eval_fraction 0")
    split_docs = {"train": docs[n_val:]}
    if n_val:
        split_docs["val"] = docs[:n_val]
    if tokenizer_path is not None and not tokenizer_path.is_file():  # a FIFO would hang the reader
        raise ParamsError(f"data preprocess: --tokenizer {tokenizer_path} is not a regular file; give a tokenizers "
                          "JSON file")
    _check_output(output_dir, tokenizer_path, overwrite)
    created = not output_dir.exists()
    stage = _staging(output_dir)
    staging = stage.path
    try:
        try:
            tok = load_or_train_tokenizer(tokenizer_path, split_docs["train"], vocab_size, staging / "tokenizer.json")
            if tokenizer_path is not None:  # the set holds the tokenizer of its shards
                shutil.copyfile(tokenizer_path, staging / "tokenizer.json")
            eos_id = tok.token_to_id(EOS_TOKEN)
            if eos_id is None:
                raise ParamsError(f"data preprocess: the tokenizer has no {EOS_TOKEN} token (needed to separate "
                                  "documents)")
            splits = {}
            for split, part in split_docs.items():
                n, files = _write_split(split, part, staging / split, tok, max_seq_length, eos_id, files_per_record,
                                        progress)
                splits[split] = (n, files, len(part))
            _output_set.switch(output_dir, staging)
        except OSError as e:
            why = f"[Errno {e.errno}] {e.strerror}" if e.errno else str(e)
            raise DataError(f"data preprocess: writing the output into {output_dir} failed ({why}); nothing in it was "
                            "changed (free space or choose another --output_dir)") from None
    finally:
        stage.close()
        if created and output_dir.is_dir() and not any(output_dir.iterdir()):
            output_dir.rmdir()
    return PreprocessResult(tokenizer_path or output_dir / "tokenizer.json", tok.get_vocab_size(), splits)
