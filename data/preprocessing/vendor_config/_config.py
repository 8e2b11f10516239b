"""A Model Zoo preprocessing config (setup / processing / dataset), read and checked once.

The three sections and their keys are the vendor's (Release 2.10's DataPreprocessor and token
generators read them; docs/architecture.md names the file). Every key is checked here, before anything
is written: an unknown section or key, a wrong type, a mode cs-run does not run, each is one
ParamsError naming the file, the key, its line and the fix. What runs afterwards reads the typed
:class:`PreprocessConfig`, never the raw dict.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from typing import Optional

from cs_run import _yaml
from cs_run.errors import ParamsError

from . import _mlm, _splits
from ._tokenizer import is_esm_folder

__all__ = ["PreprocessConfig", "load_config"]

# Keys the vendor reads, per section (anything else is refused: a typo would be silently ignored there).
SETUP_KEYS = {"data", "mode", "output_dir", "processes", "image_dir", "data_splits_dir", "data_splits",
              "context_splits", "metadata_files", "token_generator", "num_nodes", "rank", "slurm"}
DATA_KEYS = {"source", "type", "split", "cache_dir"}
PROCESSING_KEYS = {
    "huggingface_tokenizer", "custom_tokenizer", "tokenizer_params", "tokenizer_type", "eos_id", "pad_id",
    "max_seq_length", "short_seq_prob", "write_in_batch", "resume_from_checkpoint", "seed", "read_hook",
    "read_hook_kwargs", "shuffle_seed", "shuffle", "use_ftfy", "ftfy_normalizer", "wikitext_detokenize",
    "UNSAFE_skip_jsonl_decoding_errors", "read_chunk_size", "write_chunk_size", "min_sequence_len",
    "input_ids_dtype", "input_mask_dtype", "inverted_mask", "token_limit", "max_chunk_size",
    "write_remainder", "fraction_of_RAM_alloted", "end_of_turn_token", "semantic_loss_weight", "semantic_drop_mask",
    "semantic_attention_mask", "display_pbar", "files_per_record", "output_name", "split_seed",
}
DATASET_KEYS = {
    "pack_sequences", "use_vsl", "training_objective", "is_multimodal", "sep_token", "truncate_to_msl",
    "user_role", "assistant_role", "chat_template", "fim_rate", "spm_rate", "fim_prefix_tok",
    "fim_middle_tok", "fim_suffix_tok", "num_patches", "max_num_img", "image_token", "use_single_image_token",
    "register_special_image_token", "mlm_with_gather", "mlm_fraction", "ignore_index", "excluded_tokens",
    "split_text_to_tokenize", "chunk_len_to_split", "remove_bos_in_chunks", "max_prompt_length", "response_delimiter",
}
MODES = ("pretraining", "finetuning", "dpo", "nlg", "embedding_training", "embedding_generation", "custom")
RUN_MODES = ("pretraining", "finetuning", "dpo", "nlg")
"""The modes cs-run runs today; the others are named in their error."""
OBJECTIVES = ("fim", "bert_pretraining", "mlm")
"""dataset.training_objective values besides autoregressive that cs-run runs (in mode pretraining, as the vendor)."""

_VENDOR_HOOKS = "cerebras.modelzoo.data_preparation.data_preprocessing.hooks"


@dataclass
class PreprocessConfig:
    """The checked config. ``params`` is the file's dict as read (written to data_params.json, as the
    vendor does); the other fields are what the run reads."""

    path: str
    params: dict
    mode: str
    source: str
    output_dir: str
    tokenizer: str
    tokenizer_kind: str  # "huggingface", "gpt2" or "neox"
    gpt2_files: tuple[str, str] = ("", "")  # (encoder.json, vocab.bpe) of custom_tokenizer gpt2tokenizer
    max_seq_length: int = 2048
    short_seq_prob: float = 0.0
    seed: int = 0
    min_sequence_len: int = 10
    pack_sequences: bool = True
    use_ftfy: bool = True
    ftfy_normalizer: str = "NFC"
    wikitext_detokenize: bool = False
    read_hook: str = ""
    read_hook_kwargs: dict = field(default_factory=dict)
    read_chunk_size: int = 1024 * 1024
    write_chunk_size: int = 1024 * 1024
    eos_id: Optional[int] = None
    pad_id: Optional[int] = None
    sep_token: object = ...  # finetuning's separator: ... (unset: the tokenizer's), None (none) or a string
    truncate_to_msl: object = None
    chat_template: Optional[str] = None
    max_prompt_length: int = 512
    response_delimiter: str = "<response>"
    end_of_turn_token: Optional[str] = None
    fim: Optional[tuple] = None  # training_objective fim: (fim_rate, spm_rate, prefix, middle, suffix token)
    splits: Optional[object] = None  # _splits.SplitPlan of setup.data_splits / context_splits
    hf_dataset: Optional[tuple] = None  # type huggingface: (save_to_disk folder, split or None)
    inverted_mask: bool = False  # the loss mask flipped (pretraining and finetuning)
    resume: bool = False
    shuffle_seed: Optional[int] = None  # processing.shuffle: the seed (shuffle_seed, default 0); None: no shuffle
    token_limit: Optional[int] = None  # processing.token_limit; None: no limit (the vendor's false or 0)
    use_vsl: bool = False  # dataset.use_vsl: sequences packed into 5-row VSL samples (see _vsl)
    skip_jsonl_errors: bool = False
    lines: dict = field(default_factory=dict)
    objective: Optional[str] = None  # dataset.training_objective (None: autoregressive)
    mlm: Optional[dict] = None  # training_objective mlm: _mlm.check_keys' mlm_fraction, with_gather, ignore_index, ...
    multimodal: Optional[dict] = None  # dataset.is_multimodal: image_dir, image_token, num_patches, max_num_img, ...

    def at(self, key: str) -> str:
        """``file:line`` of a dotted key (the file alone where the key is not in it)."""
        line = self.lines.get(key)
        return f"{self.path}:{line}" if line else self.path


def _fail(path: str, lines: dict, key: str, problem: str, fix: str) -> ParamsError:
    line = lines.get(key)
    where = f"{path}:{line}" if line else path
    return ParamsError(f"data preprocess --config: {key} {problem} ({where}); {fix}")


def _section(params: dict, name: str, path: str, lines: dict, required: bool) -> dict:
    value = params.get(name)
    if value is None:
        if required:
            raise _fail(path, lines, name, "is missing", f"add a '{name}:' section (see the Model Zoo's "
                        "data_preprocessing/configs)")
        return {}
    if not isinstance(value, dict):
        raise _fail(path, lines, name, f"is a {type(value).__name__}, not a section", f"write '{name}:' "
                    "followed by indented keys")
    return value


def _unknown(section: dict, known: set, prefix: str, path: str, lines: dict) -> None:
    for key in section:
        if key not in known:
            raise _fail(path, lines, f"{prefix}.{key}", "is not a key the Model Zoo's preprocessing reads",
                        f"remove it or fix its spelling (known: {', '.join(sorted(known)[:12])}, ...)")


def _typed(section: dict, key: str, kind, prefix: str, path: str, lines: dict, default=None):
    value = section.get(key, default)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind in (int, float, (int, float)) and isinstance(value, bool))
    if not ok:
        want = {bool: "true or false", int: "an integer", str: "a string", dict: "a mapping",
                (int, float): "a number"}.get(kind, str(kind))
        raise _fail(path, lines, f"{prefix}.{key}", f"is {value!r}", f"give {want}")
    return value


def _out_of_scope(setup: dict, processing: dict, dataset: dict, path: str, lines: dict) -> None:
    """Modes that belong to other work: one line naming them, before any other check."""
    hook = str(processing.get("read_hook") or "")
    asks = dataset.get("is_multimodal") or setup.get("image_dir") or "llava" in hook or "image" in hook
    if asks and setup.get("mode") not in ("finetuning", None):
        raise _fail(path, lines, "setup.mode", f"is {setup.get('mode')!r} with multimodal data (image captions)",
                    "cs-run's --config runs multimodal finetuning (the llava hooks) only; use the vendor's tool for "
                    "this config")
    if asks and dataset.get("is_multimodal") is not True and setup.get("mode"):
        key = "setup.image_dir" if setup.get("image_dir") else "processing.read_hook"
        raise _fail(path, lines, key, "asks for images but dataset.is_multimodal is not true",
                    "set dataset.is_multimodal: true (the images are otherwise left out)")


def _not_yet(setup: dict, processing: dict, dataset: dict, mode: str, path: str, lines: dict) -> None:
    """Parts of the vendor's tool cs-run does not run yet: refused by name rather than run differently."""
    if mode not in RUN_MODES:
        fix = "use the vendor's tool for this mode for now"
        raise _fail(path, lines, "setup.mode", f"is {mode!r}, which cs-run's --config does not run yet "
                    f"(it runs {', '.join(RUN_MODES)})", fix)
    if processing.get("wikitext_detokenize") and mode != "pretraining":
        raise _fail(path, lines, "processing.wikitext_detokenize", f"is not run by cs-run's --config in mode {mode!r} "
                    "yet (mode pretraining only)", "set it to false")
    if processing.get("inverted_mask") and mode in ("dpo", "nlg"):
        raise _fail(path, lines, "processing.inverted_mask", f"is not run by cs-run's --config in mode {mode!r} yet",
                    "set it to false")
    not_yet = ("semantic_loss_weight", "semantic_drop_mask", "semantic_attention_mask")
    if any(processing.get(k) for k in not_yet):
        key = next(k for k in not_yet if processing.get(k))
        raise _fail(path, lines, f"processing.{key}", "is not run by cs-run's --config yet", "set it to false")
    for key in ("metadata_files", "token_generator", "slurm"):
        if setup.get(key):
            raise _fail(path, lines, f"setup.{key}", "is not run by cs-run's --config yet",
                        "remove it (split the input folder yourself) or use the vendor's tool")
    if dataset.get("split_text_to_tokenize"):
        raise _fail(path, lines, "dataset.split_text_to_tokenize", "is not run by cs-run's --config yet",
                    "set it to false")
    objective = dataset.get("training_objective")
    if objective in OBJECTIVES and mode != "pretraining":
        raise _fail(path, lines, "dataset.training_objective", f"is {objective!r} in mode {mode!r}",
                    f"the vendor runs {objective} in mode pretraining only: set setup.mode: pretraining or remove it")
    for key in ("use_vsl", "shuffle", "token_limit"):  # not built with the masked LM / BERT samples
        section, prefix = (dataset, "dataset") if key == "use_vsl" else (processing, "processing")
        if objective in ("bert_pretraining", "mlm") and section.get(key):
            raise _fail(path, lines, f"{prefix}.{key}", f"is not run by cs-run's --config with training_objective "
                        f"{objective} yet", "set it to false, or use the vendor's tool for this config")
    if objective not in (None, "autoregressive", *OBJECTIVES):
        raise _fail(path, lines, "dataset.training_objective", f"is {dataset['training_objective']!r}, "
                    "which cs-run's --config does not run yet", "remove it (plain autoregressive pretraining)")


def _sections(path: str) -> tuple[dict, dict, dict, dict, dict]:
    """The file's params, line numbers and its three sections, each key known."""
    text = _yaml.read_text(path)
    params, lines = _yaml.parse(text, path)
    if not isinstance(params, dict):
        raise ParamsError(f"data preprocess --config: {path} is not a mapping of setup / processing / dataset "
                          "sections; see the Model Zoo's data_preprocessing/configs")
    for key in params:
        if key not in ("setup", "processing", "dataset"):
            raise _fail(path, lines, str(key), "is not a section of a preprocessing config",
                        "use setup, processing and dataset")
    setup = _section(params, "setup", path, lines, True)
    processing = _section(params, "processing", path, lines, True)
    dataset = _section(params, "dataset", path, lines, False)
    _out_of_scope(setup, processing, dataset, path, lines)
    _unknown(setup, SETUP_KEYS, "setup", path, lines)
    _unknown(processing, PROCESSING_KEYS, "processing", path, lines)
    _unknown(dataset, DATASET_KEYS, "dataset", path, lines)

    return params, lines, setup, processing, dataset


def _data_source(setup: dict, path: str, lines: dict) -> tuple:
    """``setup.data``: its type, the input folder (or saved dataset) and the dataset split."""
    data = _typed(setup, "data", dict, "setup", path, lines)
    if data is None:
        raise _fail(path, lines, "setup.data", "is missing", "add data: {type: local, source: INPUT_FOLDER}")
    _unknown(data, DATA_KEYS, "setup.data", path, lines)
    kind = _typed(data, "type", str, "setup.data", path, lines)
    if kind not in ("local", "huggingface"):
        raise _fail(path, lines, "setup.data.type", f"is {kind!r}", "use local (a folder of .jsonl / .txt / .parquet "
                    "files) or huggingface (a dataset saved with datasets' save_to_disk)")
    source = _typed(data, "source", str, "setup.data", path, lines)
    hf_split = _typed(data, "split", str, "setup.data", path, lines)
    if kind == "huggingface":
        _saved_dataset(source, hf_split, path, lines)
    elif not source or not os.path.isdir(source):
        raise _fail(path, lines, "setup.data.source", f"is {source!r}, not a folder",
                    "give the folder that holds the .jsonl / .txt / .parquet inputs")
    return kind, source, hf_split


def _tokenizer(processing: dict, path: str, lines: dict) -> tuple[str, str, tuple]:
    """The one tokenizer the section names: ``(tokenizer path, kind, gpt2 encoder/vocab files)``."""
    hf = _typed(processing, "huggingface_tokenizer", str, "processing", path, lines)
    custom = _typed(processing, "custom_tokenizer", str, "processing", path, lines)
    tok_params = _typed(processing, "tokenizer_params", dict, "processing", path, lines, {})
    if bool(hf) == bool(custom):
        raise _fail(path, lines, "processing.huggingface_tokenizer", "and custom_tokenizer are both "
                    + ("given" if hf else "missing"), "give exactly one tokenizer")
    gpt2_files = ("", "")
    if hf:
        tokenizer, tokenizer_kind = _local_tokenizer(hf, path, lines), "huggingface"
        if tok_params:
            raise _fail(path, lines, "processing.tokenizer_params", "is not read with a local tokenizer folder",
                        "remove it")
    elif custom == "gpt2tokenizer":
        encoder, vocab = tok_params.get("encoder_file"), tok_params.get("vocab_file")
        for key, value in (("encoder_file", encoder), ("vocab_file", vocab)):
            if not isinstance(value, str) or not os.path.isfile(value):
                raise _fail(path, lines, f"processing.tokenizer_params.{key}", f"is {value!r}, not a file",
                            "give the gpt2 encoder.json (encoder_file) and vocab.bpe (vocab_file)")
        tokenizer, tokenizer_kind, gpt2_files = "", "gpt2", (encoder, vocab)
    elif custom == "neoxtokenizer":
        encoder = tok_params.get("encoder_file")
        if not isinstance(encoder, str) or not os.path.isfile(encoder):
            raise _fail(path, lines, "processing.tokenizer_params.encoder_file", f"is {encoder!r}, not a file",
                        "give the neox tokenizer's JSON file")
        tokenizer, tokenizer_kind = encoder, "neox"
    else:
        raise _fail(path, lines, "processing.custom_tokenizer", f"is {custom!r}, which cs-run does not load",
                    "use gpt2tokenizer or neoxtokenizer, or huggingface_tokenizer with a local folder")

    return tokenizer, tokenizer_kind, gpt2_files


def _processing(processing: dict, path: str, lines: dict, reads_text: bool = True) -> tuple:
    """The ``processing`` keys the writer reads: sequence length, short-sequence probability, the read hook,
    ftfy (needed only where the mode ``reads_text``: nlg's token ids are never cleaned); the other integer keys
    and the dtypes checked."""
    msl = _typed(processing, "max_seq_length", int, "processing", path, lines, 2048)
    if msl < 2:
        raise _fail(path, lines, "processing.max_seq_length", f"is {msl}", "give at least 2")
    ssp = _typed(processing, "short_seq_prob", (int, float), "processing", path, lines, 0.0)
    if not 0.0 <= ssp <= 1.0:
        raise _fail(path, lines, "processing.short_seq_prob", f"is {ssp}", "give a probability in [0, 1]")
    hook = _typed(processing, "read_hook", str, "processing", path, lines)
    hook_kwargs = _typed(processing, "read_hook_kwargs", dict, "processing", path, lines)
    if not hook:
        raise _fail(path, lines, "processing.read_hook", "is missing", f"name one, e.g. {_VENDOR_HOOKS}:text_read_hook")
    if not hook_kwargs or not any(str(k).endswith("_key") for k in hook_kwargs):
        raise _fail(path, lines, "processing.read_hook_kwargs", "names no *_key", "give the input's keys, e.g. "
                    "text_key: text")
    use_ftfy = _typed(processing, "use_ftfy", bool, "processing", path, lines, True)
    if use_ftfy and reads_text:
        try:
            import ftfy  # noqa: F401,PLC0415  (optional: only configs that ask for it need it)
        except ImportError:
            raise _fail(path, lines, "processing.use_ftfy", "is true but the ftfy package is not installed",
                        "pip install ftfy, or set use_ftfy: false") from None
    for key in ("eos_id", "pad_id", "read_chunk_size", "write_chunk_size", "min_sequence_len", "seed"):
        _typed(processing, key, int, "processing", path, lines)
    for key in ("input_ids_dtype", "input_mask_dtype"):
        if processing.get(key, "int32") != "int32":
            raise _fail(path, lines, f"processing.{key}", f"is {processing[key]!r}", "cs-run writes int32 (the "
                        "vendor's writer stores i4 whatever it is); remove it")
    return msl, ssp, hook, hook_kwargs, use_ftfy


def load_config(path: str) -> PreprocessConfig:
    """Read and check ``path``. Raises ParamsError (file, key, line, fix) on the first problem."""
    params, lines, setup, processing, dataset = _sections(path)

    mode = _typed(setup, "mode", str, "setup", path, lines)
    if mode is None:
        raise _fail(path, lines, "setup.mode", "is missing", f"set it to one of {', '.join(MODES)}")
    if mode not in MODES:
        raise _fail(path, lines, "setup.mode", f"is {mode!r}", f"use one of {', '.join(MODES)}")
    _not_yet(setup, processing, dataset, mode, path, lines)

    kind, source, hf_split = _data_source(setup, path, lines)
    output_dir = _typed(setup, "output_dir", str, "setup", path, lines, "./output/")
    if not output_dir.strip():
        raise _fail(path, lines, "setup.output_dir", "is empty", "give the folder the .h5 files go to")
    _typed(setup, "processes", int, "setup", path, lines)

    tokenizer, tokenizer_kind, gpt2_files = _tokenizer(processing, path, lines)

    msl, ssp, hook, hook_kwargs, use_ftfy = _processing(processing, path, lines, reads_text=mode != "nlg")
    splits = _splits.plan_splits(setup, processing, output_dir,
                                 lambda key, problem, fix: _fail(path, _nearest(lines, key), key, problem, fix))
    fim = _fim(dataset, tokenizer_kind, path, lines) if dataset.get("training_objective") == "fim" else None
    mlm = _mlm.check_keys(dataset, lambda key, problem, fix: _fail(path, lines, key, problem, fix),
                          lambda key, kind, default: _typed(dataset, key, kind, "dataset", path, lines, default)) \
        if dataset.get("training_objective") == "mlm" else None
    multimodal = _multimodal(setup, dataset, path, lines) if dataset.get("is_multimodal") is True else None
    return PreprocessConfig(
        objective=dataset.get("training_objective"), mlm=mlm, multimodal=multimodal,
        fim=fim, splits=splits, hf_dataset=(source, hf_split) if kind == "huggingface" else None,
        inverted_mask=_typed(processing, "inverted_mask", bool, "processing", path, lines, False),
        path=path, params=copy.deepcopy(params), mode=mode, source=source, output_dir=output_dir,
        tokenizer=tokenizer, tokenizer_kind=tokenizer_kind, gpt2_files=gpt2_files, max_seq_length=msl,
        short_seq_prob=float(ssp), seed=processing.get("seed", 0),
        min_sequence_len=processing.get("min_sequence_len", 10),
        pack_sequences=_typed(dataset, "pack_sequences", bool, "dataset", path, lines, True),
        use_ftfy=use_ftfy, ftfy_normalizer=_typed(processing, "ftfy_normalizer", str, "processing", path, lines, "NFC"),
        wikitext_detokenize=_typed(processing, "wikitext_detokenize", bool, "processing", path, lines, False),
        read_hook=hook, read_hook_kwargs=dict(hook_kwargs),
        sep_token=_typed(dataset, "sep_token", str, "dataset", path, lines) if "sep_token" in dataset else ...,
        truncate_to_msl=dataset.get("truncate_to_msl"),
        chat_template=_typed(dataset, "chat_template", str, "dataset", path, lines),
        max_prompt_length=_typed(dataset, "max_prompt_length", int, "dataset", path, lines, 512),
        response_delimiter=_typed(dataset, "response_delimiter", str, "dataset", path, lines, "<response>"),
        end_of_turn_token=_typed(processing, "end_of_turn_token", str, "processing", path, lines),
        read_chunk_size=processing.get("read_chunk_size", 1024) * 1024,
        write_chunk_size=processing.get("write_chunk_size", 1024) * 1024,
        eos_id=processing.get("eos_id"), pad_id=processing.get("pad_id"),
        resume=_typed(processing, "resume_from_checkpoint", bool, "processing", path, lines, False),
        shuffle_seed=_shuffle_seed(processing, path, lines), token_limit=_token_limit(processing, path, lines),
        use_vsl=_use_vsl(mode, processing, dataset, path, lines),
        skip_jsonl_errors=_typed(processing, "UNSAFE_skip_jsonl_decoding_errors", bool, "processing", path, lines,
                                 False),
        lines=lines)


def _multimodal(setup: dict, dataset: dict, path: str, lines: dict) -> dict:
    """dataset.is_multimodal's keys (the vendor's defaults), and setup.image_dir, the folder the records' image
    paths are relative to (the vendor creates it where it is missing, then skips every record: refused here)."""
    image_dir = _typed(setup, "image_dir", str, "setup", path, lines)
    if not image_dir or not os.path.isdir(image_dir):
        raise _fail(path, _nearest(lines, "setup.image_dir"), "setup.image_dir", f"is {image_dir!r}, not a folder",
                    "give the folder the records' image paths are relative to")
    if dataset.get("use_vsl"):
        raise _fail(path, lines, "dataset.use_vsl", "is not run by cs-run's --config with dataset.is_multimodal",
                    "set use_vsl to false")
    keys = {}
    for key, kind, default in (("num_patches", int, 1), ("max_num_img", int, 1)):
        keys[key] = _typed(dataset, key, kind, "dataset", path, lines, default)
        if keys[key] < 1:
            raise _fail(path, lines, f"dataset.{key}", f"is {keys[key]}", "give a positive integer")
    keys["image_token"] = _typed(dataset, "image_token", str, "dataset", path, lines, "<special_image_token>")
    keys["use_single_image_token"] = _typed(dataset, "use_single_image_token", bool, "dataset", path, lines, False)
    keys["register_special_image_token"] = _typed(dataset, "register_special_image_token", bool, "dataset", path,
                                                  lines, True)
    return {"image_dir": image_dir, **keys}


def _shuffle_seed(processing: dict, path: str, lines: dict) -> Optional[int]:
    """processing.shuffle's seed (shuffle_seed, 0 when not given, as the vendor), or None without shuffle."""
    shuffle = _typed(processing, "shuffle", bool, "processing", path, lines, False)
    seed = _typed(processing, "shuffle_seed", int, "processing", path, lines, 0)
    if seed < 0:  # numpy's seed takes 0 .. 2**32 - 1 (the vendor's np.random.seed(shuffle_seed + file))
        raise _fail(path, lines, "processing.shuffle_seed", f"is {seed}", "give an integer >= 0")
    return seed if shuffle else None


def _token_limit(processing: dict, path: str, lines: dict) -> Optional[int]:
    """processing.token_limit as a count of num_tokens, or None: absent, false or 0 mean no limit (the vendor's
    ``if self.token_limit``)."""
    value = processing.get("token_limit")
    if value is None or value is False or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(path, lines, "processing.token_limit", f"is {value!r}",
                    "give a positive integer (the tokens to write, counted as num_tokens), or false for no limit")
    return value


def _use_vsl(mode: str, processing: dict, dataset: dict, path: str, lines: dict) -> bool:
    """dataset.use_vsl, where cs-run runs it: plain pretraining and prompt / completion or chat finetuning."""
    if not _typed(dataset, "use_vsl", bool, "dataset", path, lines, False):
        return False
    if mode == "dpo" or dataset.get("training_objective") == "fim":
        what = "mode 'dpo'" if mode == "dpo" else "training_objective 'fim'"
        raise _fail(path, lines, "dataset.use_vsl", f"is true with {what}, which packs no VSL samples (the "
                    "vendor's tool writes that mode's plain samples and ignores it)", "set use_vsl to false")
    for key in ("inverted_mask", "short_seq_prob"):
        if processing.get(key):
            raise _fail(path, lines, f"processing.{key}", "is not run by cs-run's --config with dataset.use_vsl yet",
                        f"remove {key} or set use_vsl to false")
    return True


def _saved_dataset(source, split, path: str, lines: dict) -> None:
    """setup.data type huggingface: a local folder written by datasets' save_to_disk (a Dataset, or a
    DatasetDict with ``split`` one of its splits); nothing is downloaded."""
    try:
        import datasets  # noqa: F401,PLC0415  (optional: only type huggingface needs it)
    except ImportError:
        raise _fail(path, lines, "setup.data.type", "is 'huggingface' but the datasets package is not installed",
                    "pip install datasets, or export the dataset to .parquet / .jsonl and use type: local") from None
    is_dict = isinstance(source, str) and os.path.isfile(os.path.join(source, "dataset_dict.json"))
    if not isinstance(source, str) or not (is_dict or os.path.isfile(os.path.join(source, "state.json"))):
        raise _fail(path, lines, "setup.data.source", f"is {source!r}, not a folder written by save_to_disk",
                    "cs-run downloads nothing: save the dataset with dataset.save_to_disk(DIR) and give DIR")
    if is_dict:
        with open(os.path.join(source, "dataset_dict.json"), encoding="utf-8") as f:
            splits = json.load(f).get("splits", [])
        if split not in splits:
            raise _fail(path, lines, "setup.data.split" if split else "setup.data.source",
                        f"is {split!r}, not a split of the saved DatasetDict", f"give one of {', '.join(splits)}")


def _nearest(lines: dict, key: str) -> dict:
    """``lines`` with a key that is not in the file (a missing split_fractions) at its nearest parent's line."""
    parent = key
    while parent not in lines and "." in parent:
        parent = parent.rsplit(".", 1)[0]
    return {**lines, key: lines.get(parent)}


def _fim(dataset: dict, tokenizer_kind: str, path: str, lines: dict) -> tuple:
    """training_objective fim's rates and tokens (the vendor asserts all five are given)."""
    if tokenizer_kind == "gpt2":
        raise _fail(path, lines, "dataset.training_objective", "is 'fim' with custom_tokenizer gpt2tokenizer, which "
                    "cs-run has not checked against the vendor's FIM", "use neoxtokenizer or huggingface_tokenizer")
    rates = []
    for key in ("fim_rate", "spm_rate"):
        value = _typed(dataset, key, (int, float), "dataset", path, lines)
        if value is None or not 0.0 <= value <= 1.0:
            raise _fail(path, lines, f"dataset.{key}", f"is {value!r}", "give a probability in [0, 1] "
                        "(training_objective fim needs fim_rate and spm_rate)")
        rates.append(float(value))
    tokens = []
    for key in ("fim_prefix_tok", "fim_middle_tok", "fim_suffix_tok"):
        value = _typed(dataset, key, str, "dataset", path, lines)
        if not value:
            raise _fail(path, lines, f"dataset.{key}", "is missing", "name the tokenizer's FIM token, e.g. "
                        f"<{key[:-4]}>")
        tokens.append(value)
    return (*rates, *tokens)


def _local_tokenizer(name: str, path: str, lines: dict) -> str:
    """The tokenizer.json a huggingface_tokenizer names: a file, or a folder holding one (no download)."""
    if os.path.isfile(name) and name.endswith(".json"):
        return name
    if os.path.isdir(name) and os.path.isfile(os.path.join(name, "tokenizer.json")):
        return os.path.join(name, "tokenizer.json")
    if os.path.isdir(name) and is_esm_folder(name):  # ESM-2's (a slow tokenizer: no tokenizer.json)
        return os.path.join(name, "vocab.txt")
    raise _fail(path, lines, "processing.huggingface_tokenizer", f"is {name!r}, not a local folder with a "
                "tokenizer.json", "cs-run downloads nothing: save the tokenizer (tokenizer.save_pretrained(DIR)) "
                "and give DIR")
