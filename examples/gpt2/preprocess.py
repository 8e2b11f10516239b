"""Local text files -> Model Zoo GPT HDF5 shards, with a byte-level BPE tokenizer trained here.

Follows the Model Zoo's ``hdf5_preprocessing`` LM writer (Release 1.9 ``LMDataPreprocessor`` with
``pack_sequences``): each document is tokenized and ends with the end-of-text token; the token stream
is cut into windows of ``max_seq_length + 1`` tokens overlapping by one (inputs = window[:-1],
labels = window[1:]); a document's short tail carries over into the next one; the last sample is
padded with ``pad_id`` and a zero loss mask. Shards are ``examples_<n>.h5`` holding int32
``data[n_examples, 3, max_seq_length]`` in one-sample gzip chunks with an ``n_examples`` attribute.

Nothing is downloaded: the tokenizer is trained on the training documents with the ``tokenizers``
package (``pip install 'cs-run[text]'``) or read from a ``tokenizer.json`` given by path.
"""

from __future__ import annotations

import json
import logging
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

import h5py  # noqa: TID253 - this data module reads and writes HDF5 files; loaded only with the gpt2 example
import numpy as np
from tqdm import tqdm

from cs_run.errors import ParamsError

__all__ = ["PreprocessResult", "collect_documents", "stdlib_documents", "load_or_train_tokenizer", "pack_samples",
           "ShardWriter", "preprocess"]

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
FEATURES = ["input_ids", "attention_mask", "labels"]
_ENCODE_CHUNK = 64  # documents per encode_batch call


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
    bpe.train([str(p) for p in train_files], vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS_TOKEN],
              show_progress=False)
    save_to.parent.mkdir(parents=True, exist_ok=True)
    bpe.save(str(save_to))
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
        with h5py.File(path, "w") as f:
            f.attrs["n_examples"] = len(self.buffer)
            f.create_dataset("data", data=np.stack(self.buffer), dtype="i4", chunks=(1, 3, self.msl),
                             compression="gzip")
        self.files.append(path)
        self.n_examples += len(self.buffer)
        self.buffer = []


@dataclass
class PreprocessResult:
    tokenizer_path: Path
    vocab_size: int
    splits: dict  # split -> (n_examples, n_files, n_documents)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


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


def preprocess(documents: list[Path], output_dir: Path, max_seq_length: int, *, vocab_size: int = 8192,
               tokenizer_path: Optional[Path] = None, eval_fraction: float = 0.0, files_per_record: int = 4096,
               seed: int = 0, overwrite: bool = False, progress: bool = True) -> PreprocessResult:
    """Tokenize ``documents`` into ``output_dir/train`` (and ``output_dir/val``) shards.

    Documents are split by file: a seeded shuffle puts ``eval_fraction`` of them (at least one) in val.
    A trained tokenizer is saved as ``output_dir/tokenizer.json``.

    Raises:
        ParamsError: bad arguments, no documents, or shards already in an output folder (without
            ``overwrite``: nothing written before is replaced unasked).
    """
    if max_seq_length < 2:
        raise ParamsError(f"data preprocess: --max_seq_length must be >= 2, got {max_seq_length}")
    if files_per_record < 1:
        raise ParamsError(f"data preprocess: --files_per_record must be >= 1, got {files_per_record}")
    if not 0.0 <= eval_fraction < 1.0:
        raise ParamsError(f"data preprocess: --eval_fraction must be in [0, 1), got {eval_fraction}")
    if not documents:
        raise ParamsError("data preprocess: no input documents (give files or folders, or --stdlib)")
    docs = list(documents)
    random.Random(seed).shuffle(docs)
    n_val = max(1, round(len(docs) * eval_fraction)) if eval_fraction > 0 else 0
    if n_val >= len(docs):
        raise ParamsError(f"data preprocess: {len(docs)} document(s) cannot be split into train and val; "
                          "give more files or --eval_fraction 0")
    split_docs = {"train": docs[n_val:]}
    if n_val:
        split_docs["val"] = docs[:n_val]
    for split in split_docs:
        folder = output_dir / split
        if folder.is_dir() and any(folder.glob("*.h5")):
            if not overwrite:
                raise ParamsError(f"data preprocess: {folder} already holds *.h5 shards; use another --output_dir "
                                  "or --overwrite")
            for old in folder.glob("*.h5"):
                old.unlink()
    saved = output_dir / "tokenizer.json"
    tok = load_or_train_tokenizer(tokenizer_path, split_docs["train"], vocab_size, saved)
    eos_id = tok.token_to_id(EOS_TOKEN)
    if eos_id is None:
        raise ParamsError(f"data preprocess: the tokenizer has no {EOS_TOKEN} token (needed to separate documents)")
    splits = {}
    for split, part in split_docs.items():
        n, files = _write_split(split, part, output_dir / split, tok, max_seq_length, eos_id, files_per_record,
                                progress)
        splits[split] = (n, files, len(part))
    return PreprocessResult(tokenizer_path or saved, tok.get_vocab_size(), splits)
