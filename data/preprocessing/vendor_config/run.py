"""``cs-run data preprocess --config FILE.yaml``: one Model Zoo preprocessing config, run end to end.

Reads and checks the config (_config), loads its tokenizer (_tokenizer), streams the inputs through
the read hook in the vendor's read chunks (_inputs), cuts samples (_pretraining) and writes the
vendor's files, staged (_output). The output is meant to equal the vendor tool's on the same inputs
(tests/data/test_vendor_preprocess.py compares them with recorded vendor output).
"""

from __future__ import annotations

import copy
import logging
import os
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np
from tqdm import tqdm

from cs_run.errors import ParamsError

from . import _bert, _dpo, _fim, _finetuning, _inputs, _mlm, _output, _pretraining, _splits
from ._config import load_config
from ._tokenizer import load_tokenizer

__all__ = ["PreprocessSummary", "preprocess_config"]

logger = logging.getLogger(__name__)


@dataclass
class PreprocessSummary:
    """What a run wrote: the output folder, its files, the sample count and the tokenizer's vocab size."""

    output_dir: str
    files: list[str]
    n_examples: int
    vocab_size: int


def preprocess_config(path: str, progress: bool = False) -> PreprocessSummary:
    """Run the config at ``path``. Raises ParamsError (bad config, inputs or output folder) or DataError
    (an unreadable input line, a failed write); on either the output folder is as it was."""
    cfg = load_config(path)
    if cfg.hf_dataset is not None:
        with tempfile.TemporaryDirectory(prefix="cs-run-hf-") as folder:
            # the vendor's route: the dataset written out as parquet (datasets' to_parquet), then read as a local input
            _inputs.export_saved_dataset(*cfg.hf_dataset, os.path.join(folder, "data", "dataset.parquet"),
                                         cfg.at("setup.data.source"))
            return _dispatch(replace(cfg, source=os.path.join(folder, "data"), hf_dataset=None), progress)
    return _dispatch(cfg, progress)


def _dispatch(cfg, progress: bool) -> PreprocessSummary:
    if cfg.splits is not None:
        return _run_splits(cfg, progress)
    return _run(cfg, progress)


def _run_splits(cfg, progress: bool) -> PreprocessSummary:
    """setup.data_splits / context_splits: the records dealt into data_splits_dir (see _splits), then each split
    preprocessed into its own output_dir/SPLIT/msl_N, with the params the vendor writes there."""
    plan = cfg.splits
    for name, msl in [(None, None)] + plan.targets:  # every folder a split writes, before anything is written
        _output.check_output_dir(_splits.target_dir(cfg.output_dir, name, msl), cfg.at("setup.output_dir"))
    _splits.check_splits_dir(plan, cfg.at("setup.data_splits_dir"))
    _inputs.resolve_hook(cfg.read_hook, cfg.mode, cfg.at("processing.read_hook"))
    files = _inputs.find_files(cfg.source)
    if not files:
        raise ParamsError(f"data preprocess --config: setup.data.source {cfg.source} holds no "
                          f"{', '.join(_inputs.SUFFIXES)} files ({cfg.at('setup.data.source')}); point it at the inputs")
    _splits.write_splits(plan, files, cfg.source, lambda p: _inputs._rows(p, cfg.skip_jsonl_errors))
    base = copy.deepcopy(cfg.params)
    for key in ("data_splits", "context_splits", "data_splits_dir"):
        base["setup"].pop(key, None)
    base["processing"].pop("split_seed", None)
    base.setdefault("dataset", {})  # the vendor's split runs write an empty dataset section where there was none
    written, n, vocab = [], 0, 0
    for name, msl in plan.targets:
        params = copy.deepcopy(base)
        source = _splits.target_dir(plan.splits_dir, name, msl)
        out = _splits.target_dir(cfg.output_dir, name, msl)
        params["setup"]["data"]["source"], params["setup"]["output_dir"] = source, out
        length = cfg.max_seq_length
        if msl is not None:
            length = params["processing"]["max_seq_length"] = _splits.normalize_msl(msl, None)
        if not os.path.isdir(source):
            raise ParamsError(f"data preprocess --config: no record was dealt to {source} "
                              f"({cfg.at('setup.data_splits')}); give that split a larger fraction or more records")
        sub = replace(cfg, params=params, source=source, output_dir=out, max_seq_length=length, splits=None)
        summary = _run(sub, progress)
        written += [os.path.relpath(os.path.join(out, f), cfg.output_dir) for f in summary.files]
        n, vocab = n + summary.n_examples, summary.vocab_size
    return PreprocessSummary(cfg.output_dir, written, n, vocab)


def _generator(cfg, tok) -> tuple:
    """The mode's sample generator, the counts it keeps and the rows it writes."""
    features = _pretraining.FEATURES
    if cfg.mode == "dpo":
        if cfg.chat_template:
            logger.warning("dataset.chat_template is not applied in mode dpo (nor by the Model Zoo's tool): the "
                           "tokenizer's own chat template renders the records")
        gen = _dpo.DpoSamples(tok, max_seq_length=cfg.max_seq_length, max_prompt_length=cfg.max_prompt_length,
                              use_ftfy=cfg.use_ftfy, ftfy_normalizer=cfg.ftfy_normalizer,
                              response_delimiter=cfg.response_delimiter)
        stats_keys, features = _pretraining.STATS_KEYS, _dpo.DPO_FEATURES
    elif cfg.mode == "finetuning":
        gen = _finetuning.FinetuningSamples(
            tok, max_seq_length=cfg.max_seq_length, min_sequence_len=cfg.min_sequence_len, use_ftfy=cfg.use_ftfy,
            ftfy_normalizer=cfg.ftfy_normalizer, sep_token=cfg.sep_token, truncate_to_msl=cfg.truncate_to_msl,
            chat_template=cfg.chat_template, end_of_turn_token=cfg.end_of_turn_token, inverted_mask=cfg.inverted_mask)
        stats_keys = _finetuning.STATS_KEYS
    elif cfg.objective == "mlm":
        gen = _mlm.MlmSamples(tok, max_seq_length=cfg.max_seq_length, seed=cfg.seed, use_ftfy=cfg.use_ftfy,
                              ftfy_normalizer=cfg.ftfy_normalizer, where=cfg.at("processing.huggingface_tokenizer"),
                              wikitext_detokenize=cfg.wikitext_detokenize, **cfg.mlm)
        stats_keys, features = _pretraining.STATS_KEYS, _mlm.features(cfg.mlm["with_gather"])
    else:
        args = dict(max_seq_length=cfg.max_seq_length, pack_sequences=cfg.pack_sequences,
                    short_seq_prob=cfg.short_seq_prob, seed=cfg.seed, min_sequence_len=cfg.min_sequence_len,
                    use_ftfy=cfg.use_ftfy, ftfy_normalizer=cfg.ftfy_normalizer,
                    wikitext_detokenize=cfg.wikitext_detokenize, inverted_mask=cfg.inverted_mask)
        gen = (_fim.FimSamples(tok, fim=cfg.fim, where=cfg.at("dataset.fim_prefix_tok"), **args) if cfg.fim else
               _bert.BertSamples(tok, truncate_to_msl=cfg.truncate_to_msl, **args)
               if cfg.objective == "bert_pretraining" else _pretraining.PretrainingSamples(tok, **args))
        stats_keys = _pretraining.STATS_KEYS
        features = _bert.FEATURES if cfg.objective == "bert_pretraining" else features
    return gen, stats_keys, features


def _run(cfg, progress: bool) -> PreprocessSummary:
    """One preprocessing run of a checked config (no splits) into cfg.output_dir."""
    done = _output.finished_run(cfg.output_dir)
    if cfg.resume and done is not None:
        # The output appears only whole (staged), so a folder holding data_params.json is a finished run: resuming
        # it has nothing left to do. An interrupted run left nothing there and starts over below.
        logger.info("data preprocess: %s already holds a finished run (data_params.json); nothing to resume",
                    cfg.output_dir)
        return PreprocessSummary(cfg.output_dir, *done)
    if cfg.resume:
        logger.info("data preprocess: no finished run in %s; an interrupted run leaves nothing behind (its output is "
                    "staged), so this one starts from the first input", cfg.output_dir)
    _output.check_output_dir(cfg.output_dir, cfg.at("setup.output_dir"))
    hook = _inputs.resolve_hook(cfg.read_hook, cfg.mode, cfg.at("processing.read_hook"))
    files = _inputs.find_files(cfg.source)
    if not files:
        raise ParamsError(f"data preprocess --config: setup.data.source {cfg.source} holds no "
                          f"{', '.join(_inputs.SUFFIXES)} files ({cfg.at('setup.data.source')}); point it at the inputs")
    tok_key = "processing.huggingface_tokenizer" if cfg.tokenizer_kind == "huggingface" else "processing.tokenizer_params"
    tok = load_tokenizer(cfg.tokenizer_kind, cfg.tokenizer, cfg.gpt2_files, cfg.eos_id, cfg.pad_id, cfg.at(tok_key))
    if cfg.params["setup"].get("processes", 1) != 1:
        logger.info("setup.processes %s: cs-run writes the layout of processes: 1 (one process reads every file)",
                    cfg.params["setup"]["processes"])
    gen, stats_keys, features = _generator(cfg, tok)
    keys = [v for k, v in cfg.read_hook_kwargs.items() if str(k).endswith("_key")]
    h5_keys = getattr(gen, "H5_KEYS", ("data",))  # the datasets of each .h5 file (masked LM: data and labels)

    out = _output.Output(cfg.output_dir, cfg.params)
    try:
        stats = dict.fromkeys(stats_keys, 0)
        buffer: list[tuple[np.ndarray, ...]] = []  # per read chunk, one array per h5 key
        chunk_no = 0
        bar = tqdm(unit=" records", desc=f"preprocess ({len(files)} files)", disable=not progress, file=sys.stderr)
        for chunk in _inputs.read_chunks(files, keys, hook, cfg.read_hook_kwargs, cfg.read_chunk_size,
                                          cfg.skip_jsonl_errors):
            chunk_stats: dict = defaultdict(int)
            samples = [s for where, entries in chunk for s in gen.document(entries, chunk_stats, where)]
            bar.update(len(chunk))
            if samples:  # a chunk that made no sample adds nothing, its counts included (as the vendor)
                for key, value in chunk_stats.items():
                    stats[key] += value
                buffer.append(_output.stack(samples))
                if _output.buffer_size(buffer, h5_keys) >= cfg.write_chunk_size:
                    out.write_h5(f"output_chunk_0_{chunk_no}.h5", buffer, h5_keys)
                    buffer = []
            chunk_no += 1
        bar.close()
        if buffer:
            out.write_h5(f"output_chunk_0_{chunk_no}.h5", buffer, h5_keys)
        rest, rest_stats = gen.rest()
        if rest:
            out.write_h5("output_chunk_1_prefix.h5", [_output.stack(rest)], h5_keys)
            for key in ("num_pad_tokens", "non_pad_tokens", "num_masked_tokens", "loss_valid_tokens", "num_tokens",
                        "n_examples"):
                stats[key] += rest_stats.get(key, 0)
        out.write_params({"eos_id": tok.eos_id, "pad_id": tok.pad_id, "vocab_size": tok.vocab_size},
                         features, stats)
        out.commit()
    except OSError as e:
        out.close()
        raise _output.write_failed(cfg.output_dir, e) from None
    except BaseException:
        out.close()
        raise
    written = sorted(n for n in out.names if n.endswith(".h5"))
    return PreprocessSummary(cfg.output_dir, written, stats["n_examples"], tok.vocab_size)
