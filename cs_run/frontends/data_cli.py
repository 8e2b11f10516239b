"""``cs-run data preprocess``: text files -> Model Zoo GPT HDF5 shards (a group the top-level CLI attaches)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional

import click

from cs_run.data.preprocessing.text_to_hdf5 import collect_documents, stdlib_documents
from cs_run.data.preprocessing.text_to_hdf5 import preprocess as run
from cs_run.data.preprocessing.vendor_config import preprocess_config
from cs_run.errors import ParamsError
from cs_run.exits import ErrorGroup
from cs_run.frontends.help_format import Flag, HelpCommand

__all__ = ["data"]


@click.group(name="data", cls=ErrorGroup)
def data() -> None:
    """Prepare training data."""


@data.command(cls=HelpCommand, examples=[
    ("what make run-gpt2 shards: this Python's standard library sources, 5% held out for validation",
     "cs-run data preprocess --stdlib -o data --max_seq_length 128 --vocab_size 4096 --eval_fraction 0.05"),
    ("your text files and folders, with an existing tokenizer",
     "cs-run data preprocess corpus/ notes.txt -o data --tokenizer tokenizer.json"),
    ("write again over the shards already there (swapped in at the end)",
     "cs-run data preprocess corpus/ -o data --pattern '*.md' --overwrite"),
    ("a Model Zoo preprocessing config (setup / processing / dataset), as the vendor's data_preprocess runs it",
     "cs-run data preprocess --config configs/hf_autoregressive_lm_preprocessing.yaml")])
@click.option("--config", "config", type=click.Path(path_type=Path), cls=Flag, default_text="off: the flags below",
              help="Run a Model Zoo data preprocessing config (YAML: setup / processing / dataset); writes the "
                   "vendor's .h5 files and data_params.json to its setup.output_dir. The other flags are not used.")
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--output", "--output_dir", "-o", "output_dir", cls=Flag, metavar="OUTPUT_DIR",
              default_text="required, unless --config (which names its setup.output_dir)",
              type=click.Path(file_okay=False, path_type=Path),
              help="Writes OUTPUT_DIR/train (and val) shards and OUTPUT_DIR/tokenizer.json (-o is --output in "
                   "every cs-run command).")
@click.option("--stdlib", is_flag=True, cls=Flag, default_text="off",
              help="Also take the running Python's top-level standard library modules as documents.")
@click.option("--pattern", multiple=True, default=("*.txt",), show_default=True,
              help="File patterns searched in input folders (repeatable).")
@click.option("--max_seq_length", type=click.IntRange(min=2), default=128, show_default=True,
              help="Tokens per sample (the shards' max_sequence_length).")
@click.option("--tokenizer", "tokenizer_path", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              cls=Flag, default_text="a byte-level BPE trained on the train files", help="An existing tokenizers JSON file.")
@click.option("--vocab_size", type=click.IntRange(min=257), default=8192, show_default=True,
              help="Vocabulary of the trained tokenizer.")
@click.option("--eval_fraction", type=click.FloatRange(0.0, 1.0, max_open=True), default=0.0, show_default=True,
              help="Fraction of the documents written to OUTPUT_DIR/val.")
@click.option("--files_per_record", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Samples per .h5 shard.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the train/val document split.")
@click.option("--overwrite", is_flag=True, cls=Flag, default_text="off: an OUTPUT_DIR holding shards is refused",
              help="Replace the shards and tokenizer.json already in OUTPUT_DIR (the new set is switched in at the "
                   "end by one rename: a failure or a kill keeps the old; the old set's files are removed).")
def preprocess(config: Optional[Path], inputs: tuple[Path, ...], output_dir: Optional[Path], stdlib: bool, pattern: tuple[str, ...],
               max_seq_length: int, tokenizer_path: Optional[Path], vocab_size: int, eval_fraction: float,
               files_per_record: int, seed: int, overwrite: bool) -> None:
    """Tokenize text files (and folders) into GPT HDF5 shards for GptHDF5DataProcessor."""

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if config is not None:
        if inputs or output_dir is not None or stdlib:
            raise ParamsError("data preprocess: --config takes its inputs and output folder from the config "
                              "(setup.data.source, setup.output_dir); drop the INPUTS, -o and --stdlib")
        summary = preprocess_config(str(config), progress=sys.stderr.isatty())
        click.echo(f"{summary.n_examples} samples in {len(summary.files)} file(s) -> {summary.output_dir} "
                   f"(data_params.json; vocab_size {summary.vocab_size})")
        return
    if output_dir is None:
        raise ParamsError("data preprocess: -o/--output_dir is required (or give --config FILE.yaml)")
    docs = collect_documents(inputs, tuple(pattern)) + (stdlib_documents() if stdlib else [])
    result = run(docs, output_dir, max_seq_length, vocab_size=vocab_size, tokenizer_path=tokenizer_path,
                 eval_fraction=eval_fraction, files_per_record=files_per_record, seed=seed, overwrite=overwrite,
                 progress=sys.stderr.isatty())
    for split, (n, files, n_docs) in result.splits.items():
        click.echo(f"{split}: {n} samples of {max_seq_length} tokens in {files} file(s) from {n_docs} documents "
                   f"-> {output_dir / split}")
    click.echo(f"tokenizer {result.tokenizer_path}: vocab_size {result.vocab_size} (model.vocab_size must be >= this)")
