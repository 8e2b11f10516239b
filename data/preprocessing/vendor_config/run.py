"""``cs-run data preprocess --config FILE.yaml``: one Model Zoo preprocessing config, run end to end.

Reads and checks the config (_config), loads its tokenizer (_tokenizer), streams the inputs through
the read hook in the vendor's read chunks (_inputs), cuts samples (_pretraining; _vsl packs them with use_vsl),
stops at processing.token_limit and writes the vendor's files, buffered or shuffled (processing.shuffle), staged
(_output). The output is meant to equal the vendor tool's on the same inputs
(tests/data/test_vendor_preprocess.py compares them with recorded vendor output).
"""

from __future__ import annotations

import bisect
import copy
import logging
import math
import os
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np
from tqdm import tqdm

from cs_run.errors import ParamsError

from . import _bert, _dpo, _fim, _finetuning, _inputs, _mlm, _multimodal, _nlg, _output, _pretraining, _splits, _vsl
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
    _inputs.resolve_hook(cfg.read_hook, "multimodal" if cfg.multimodal else cfg.mode, cfg.at("processing.read_hook"))
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
    elif cfg.mode == "nlg":
        gen = _nlg.NlgSamples(max_seq_length=cfg.max_seq_length, vocab_size=tok.vocab_size)
        stats_keys = _pretraining.STATS_KEYS
    elif cfg.multimodal is not None:
        gen = _multimodal.MultimodalSamples(
            tok, max_seq_length=cfg.max_seq_length, min_sequence_len=cfg.min_sequence_len, use_ftfy=cfg.use_ftfy,
            ftfy_normalizer=cfg.ftfy_normalizer, sep_token=cfg.sep_token, truncate_to_msl=cfg.truncate_to_msl,
            chat_template=cfg.chat_template, end_of_turn_token=cfg.end_of_turn_token, inverted_mask=cfg.inverted_mask,
            where=cfg.at("dataset.image_token"), **cfg.multimodal)
        stats_keys, features = _finetuning.STATS_KEYS, _multimodal.FEATURES
    elif cfg.mode == "finetuning":
        gen = (_vsl.VslFinetuningSamples if cfg.use_vsl else _finetuning.FinetuningSamples)(
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
               if cfg.objective == "bert_pretraining" else
               (_vsl.VslPretrainingSamples if cfg.use_vsl else _pretraining.PretrainingSamples)(tok, **args))
        stats_keys = _pretraining.STATS_KEYS
        features = _bert.FEATURES if cfg.objective == "bert_pretraining" else features
    if cfg.use_vsl:
        stats_keys, features = stats_keys + ["num_sequences_before_packing"], _vsl.VSL_FEATURES
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
    hook = _inputs.resolve_hook(cfg.read_hook, "multimodal" if cfg.multimodal else cfg.mode,
                                cfg.at("processing.read_hook"))
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

    out = _output.Output(cfg.output_dir, cfg.params)
    try:
        stats = _write_samples(cfg, gen, out, files, keys, hook, stats_keys, progress)
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


def _chunk_samples(cfg, gen, chunk: list) -> tuple[list[list], list[dict], dict]:
    """One read chunk through the generator: its units (a record's samples; with use_vsl one packed sample each),
    the running counts after each unit (the vendor's checkpoint list, which token_limit cuts at) and the
    chunk's counts."""
    stats: dict = defaultdict(int)
    units, snapshots = [], []
    for where, entries in chunk:
        made = gen.document(entries, stats, where)
        if made:
            units.append(made)
            snapshots.append(dict(stats))
    if cfg.use_vsl and units:
        packed, packed_snapshots = gen.pack_chunk(units)
        stats.update(packed_snapshots[-1])
        # each packed sample's counts over the record counts of the unit at its place (the vendor's own list; where
        # a chunk packs into more samples than it had records, the vendor stops on an IndexError, cs-run reads on)
        snapshots = [{**snapshots[min(i, len(snapshots) - 1)], **p} for i, p in enumerate(packed_snapshots)]
        units = [[sample] for sample in packed]
    return units, snapshots, stats


def _output_files(files: list[str], write_chunk_size: int) -> int:
    """How many files processing.shuffle deals samples to: the inputs' size (compressed ones counted 3 times) over
    write_chunk_size, rounded up (the vendor's total_output_files)."""
    compressed = (".jsonl.zst", ".jsonl.zst.tar", ".json.gz", ".parquet")
    size = sum(os.path.getsize(f) * (3 if f.endswith(compressed) else 1) for f in files)
    return math.ceil(size / write_chunk_size)


def _deal(out, rng, n_files: int, samples: list, h5_keys: tuple[str, ...] = ("data",)) -> None:
    """processing.shuffle: each sample to ``output_chunk_<k>.h5``, k drawn per sample (the vendor's
    np.random.choice(np.arange(n_files), n)); a sample of several arrays keeps them together."""
    columns = _output.stack(samples)
    picks = rng.choice(np.arange(n_files), len(columns[0]))
    for k in dict.fromkeys(picks.tolist()):
        out.append_h5(f"output_chunk_{k}.h5", tuple(c[picks == k] for c in columns), h5_keys)


def _write_samples(cfg, gen, out, files, keys, hook, stats_keys, progress: bool) -> dict:
    """Stream the inputs into ``out`` (staged): the vendor's buffered files, or its shuffled ones; stop at
    token_limit. Returns the post-process counts."""
    stats = dict.fromkeys(stats_keys, 0)
    rng = None
    if cfg.shuffle_seed is not None:
        # numpy's global RNG, seeded shuffle_seed at the start of the vendor's process_files: the FIM draws share it
        rng, n_files = np.random.RandomState(cfg.shuffle_seed), _output_files(files, cfg.write_chunk_size)
        if cfg.fim:
            gen.np_rng = rng
    buffer: list[tuple[np.ndarray, ...]] = []  # per read chunk, one array per h5 key
    h5_keys = getattr(gen, "H5_KEYS", ("data",))  # the datasets of each .h5 file (masked LM: data and labels)
    chunk_no, total_tokens = 0, 0
    bar = tqdm(unit=" records", desc=f"preprocess ({len(files)} files)", disable=not progress, file=sys.stderr)
    for chunk in _inputs.read_chunks(files, keys, hook, cfg.read_hook_kwargs, cfg.read_chunk_size,
                                      cfg.skip_jsonl_errors):
        units, snapshots, chunk_stats = _chunk_samples(cfg, gen, chunk)
        bar.update(len(chunk))
        stop = False
        if cfg.token_limit is not None:
            # counted per chunk; the chunk that reaches the limit keeps its units up to the one that reached it
            before, total_tokens = total_tokens, total_tokens + chunk_stats.get("num_tokens", 0)
            stop = total_tokens >= cfg.token_limit
            if stop and units:
                cut = bisect.bisect_left([s.get("num_tokens", 0) + before for s in snapshots], cfg.token_limit)
                cut = min(cut, len(units) - 1)
                chunk_stats = {**chunk_stats, **snapshots[cut]}
                units = units[: cut + 1]
        if units:  # a chunk that made no sample adds nothing, its counts included (as the vendor)
            for key, value in chunk_stats.items():
                stats[key] += value
            samples = [s for unit in units for s in unit]
            if rng is not None:
                _deal(out, rng, n_files, samples, h5_keys)
            else:
                buffer.append(_output.stack(samples))
                if _output.buffer_size(buffer, h5_keys) >= cfg.write_chunk_size:
                    out.write_h5(f"output_chunk_0_{chunk_no}.h5", buffer, h5_keys)
                    buffer = []
        chunk_no += 1
        if stop:  # no later chunk is read (the packed rest below is still written, as the vendor writes it)
            logger.info("data preprocess: processing.token_limit %d reached (%d tokens)", cfg.token_limit,
                        total_tokens)
            break
    bar.close()
    if buffer:
        out.write_h5(f"output_chunk_0_{chunk_no}.h5", buffer, h5_keys)
    if rng is not None:
        rng.seed(cfg.shuffle_seed)  # the vendor seeds numpy again before the packed rest
    rest, rest_stats = gen.rest()
    if rest:
        if rng is not None:
            _deal(out, rng, n_files, rest, h5_keys)
        else:
            out.write_h5("output_chunk_1_prefix.h5", [_output.stack(rest)], h5_keys)
        for key in ("num_pad_tokens", "non_pad_tokens", "num_masked_tokens", "loss_valid_tokens", "num_tokens",
                    "n_examples"):
            stats[key] += rest_stats.get(key, 0)
    if rng is not None:
        out.shuffle_files(cfg.shuffle_seed)
    return stats
