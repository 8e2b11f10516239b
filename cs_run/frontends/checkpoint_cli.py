"""``cs-run checkpoint convert|info``: a click group the top-level ``cs-run`` CLI attaches.

Errors go through :mod:`cs_run.exits` (one ``Error: <message>`` line, 1 for CheckpointError, 2 for
bad input), whether the group runs on its own or inside ``cs-run``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import click
import numpy as np
import yaml

from cs_run.checkpoint import hf_folder
from cs_run.checkpoint.convert import convert as run_convert
from cs_run.checkpoint.files import info as run_info
from cs_run.checkpoint.reader import raise_if_damaged
from cs_run.errors import CheckpointError, ParamsError
from cs_run.exits import ErrorGroup
from cs_run.frontends.help_format import Flag, HelpCommand
from cs_run.models.dpo.model import decoder_of
from cs_run.registry import apply_model_defaults, hf_converter

__all__ = ["checkpoint"]


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _show(value: object, dtype: str | None) -> str:
    """A scalar for the info table: strings quoted and cut at 40 characters, a float of a narrower
    dtype with that dtype's shortest digits (0.01, not 0.009999999776482582)."""
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, float) and dtype in ("float32", "float16", "bfloat16"):
        return str(np.float32(value) if dtype != "float16" else np.float16(value))
    return repr(value)


def _run_params(checkpoint: Path, params_path: Optional[str]) -> Path:
    """The params of the model in ``checkpoint``: --params, else the run's params_resolved.yaml beside it, else
    the params file ``convert --from hf`` wrote beside it (the checkpoint's name with .yaml)."""
    if params_path:
        return Path(params_path)
    for path in (checkpoint.parent / "params_resolved.yaml", checkpoint.with_suffix(".yaml")):
        if path.is_file():
            return path
    raise ParamsError(f"checkpoint convert --to hf: no params for {checkpoint} (neither params_resolved.yaml nor "
                      f"{checkpoint.with_suffix('.yaml').name} beside it); give --params with the run's params file")


def _read_params(path: Path) -> dict:
    try:
        raw = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, RecursionError) as e:
        raise ParamsError(f"{path}: not valid YAML ({str(e).splitlines()[0] if str(e) else type(e).__name__})") \
            from None
    except OSError as e:
        raise ParamsError(f"{path}: cannot read it ({e.strerror or e})") from None
    return raw if isinstance(raw, dict) else {}


def _model_keys(path: Path) -> dict:
    """The ``model:`` section of the params at ``path``, its model named as a run would (a Model Zoo file
    without model.name by its data_processor)."""
    model = apply_model_defaults(_read_params(path)).get("model")
    if not isinstance(model, dict):
        raise ParamsError(f"{path}: no model: section (checkpoint convert --to hf needs the run's model keys)")
    return model


def _tokenizer_files(checkpoint: Path, params: Path) -> list[Path]:
    """The tokenizer files (and generation config) that go with the model: beside the params file (where
    ``--from hf`` put them), else beside the params file of the newest run in the checkpoint's model_dir
    (its runs/ records), else the tokenizer.json ``cs-run data preprocess`` wrote above train_input.data_dir."""
    folders = [params.parent]
    if params.name == "params_resolved.yaml":
        for record in sorted((checkpoint.parent / "runs").glob("*.yaml"), reverse=True):
            source = _read_params(record).get("params_file")
            if isinstance(source, str) and source:
                folders.append(Path(source).parent)
                break
        data_dir = (_read_params(params).get("train_input") or {}).get("data_dir")
        if isinstance(data_dir, str) and data_dir:
            folders.append(Path(data_dir).parent)
    for folder in folders:
        found = hf_folder.side_files(folder)
        if any(p.name == "tokenizer.json" for p in found):
            return found
    return []


def _hf_model_type(hf_dir: Path) -> tuple[Any, str]:
    """The model_type of an HF folder's config.json, or of its component folders' (one model_type in all: a
    model the Model Zoo converts as several HF models, e.g. dpr's q_encoder/ and ctx_encoder/); and where."""
    cfg_path = hf_dir / "config.json"
    if not os.path.lexists(cfg_path):
        parts = sorted(p / "config.json" for p in (hf_dir.iterdir() if hf_dir.is_dir() else ())
                       if p.is_dir() and (p / "config.json").is_file())
        types = {hf_folder.read_config(p).get("model_type") for p in parts}
        if len(parts) > 1 and len(types) == 1:
            return types.pop(), f"{parts[0]}: model_type"
        raise CheckpointError(f"--from hf: {cfg_path} not found (expected a Hugging Face model folder with "
                              "config.json and its weights)")
    return hf_folder.read_config(cfg_path).get("model_type"), f"{cfg_path}: model_type"


@click.group(name="checkpoint", cls=ErrorGroup)
def checkpoint() -> None:
    """Inspect and convert checkpoints (H5, torch pickle, safetensors)."""


HF_FAMILIES = ("gpt2, gpt3 (--to hf: GPT-2), btlm, jais, gptj, gpt-neox (model_type gpt_neox), llama, mistral, "
               "mixtral, gemma2, falcon, bloom, starcoder and santacoder (model_type gpt_bigcode), mpt, "
               "vision_transformer (model_type vit and clip_vision_model), llava, bert (model_type bert and roberta), "
               "bert/classifier (model_type bert, BertForSequenceClassification), "
               "bert/token_classifier (model_type bert, BertForTokenClassification), esm2 (model_type esm), t5, "
               "dpr (a folder of q_encoder/ and ctx_encoder/, as the Model Zoo's)")
"""The Hugging Face model_types ``--from hf`` reads and the families ``--to hf`` writes (the models with a
Hugging Face converter: models/*/hf.py; tests/cli/test_help.py checks this against the registry)."""


@checkpoint.command(cls=HelpCommand, examples=[
    ("a run's checkpoint as a torch file (the format from DST's extension)",
     "cs-run checkpoint convert model_dir/fc_mnist/checkpoint_100.mdl weights.pt"),
    ("to safetensors, trusting SRC (no CRC32 check)",
     "cs-run checkpoint convert checkpoint_100.mdl weights.safetensors --no_verify"),
    ("a file the vendor's cstorch.load reads", "cs-run checkpoint convert checkpoint_100.mdl vendor.mdl --to vendor"),
    ("a Hugging Face folder to a checkpoint and its model: params (llama.yaml)",
     "cs-run checkpoint convert hf_llama llama.mdl --from hf"),
    ("a decoder run's checkpoint to a Hugging Face folder (its params_resolved.yaml names the model)",
     "cs-run checkpoint convert model_dir/checkpoint_30.mdl hf_dir --to hf"),
    ("a sharded run's checkpoint folder to one file, and back to 4 shards",
     "cs-run checkpoint convert model_dir/checkpoint_30.mdl whole.mdl"),
    ("", "cs-run checkpoint convert whole.mdl four.mdl --to sharded --shards 4"),
])
@click.argument("src", type=click.Path(dir_okay=True))
@click.argument("dst", type=click.Path())
@click.option("--to", "to", type=click.Choice(["h5", "torch", "safetensors", "vendor", "hf", "sharded"]), default=None,
              cls=Flag, default_text="from DST's extension: .h5/.mdl, .pt/.pth/.bin, .safetensors",
              help="Target format. vendor: the vendor's format 0.5, read by cerebras.pytorch's cstorch.load; "
                   "sharded: a sharded checkpoint folder DST of --shards N shards, as N sharded replicas write; "
                   f"hf: a Hugging Face folder DST (config.json + model.safetensors) of a run of {HF_FAMILIES}.")
@click.option("--from", "from_", type=click.Choice(["hf"]), default=None, cls=Flag,
              default_text="SRC's own format, read from it",
              help=f"hf: SRC is a Hugging Face folder (config.json + weights) of {HF_FAMILIES}; writes the "
                   "checkpoint DST and DST's .yaml params.")
@click.option("--params", "params_path", type=click.Path(dir_okay=False, exists=True), cls=Flag,
              default_text="params_resolved.yaml beside SRC", help="With --to hf: the run's params.")
@click.option("--allow_pickle", is_flag=True, cls=Flag, default_text="off",
              help="Read and write pickled objects (trusted files only).")
@click.option("--no_verify", is_flag=True, cls=Flag, default_text="off: every tensor's CRC32 is checked",
              help="Skip the CRC32 check of every tensor of SRC (a damaged tensor is an error).")
@click.option("--overwrite", is_flag=True, cls=Flag, default_text="off: an existing DST is refused",
              help="Replace DST when it exists.")
@click.option("--shards", type=click.IntRange(1, 65536), default=None, cls=Flag, default_text="none",
              help="With --to sharded: the number of shards (replicas) DST is written for.")
def convert(src: str, dst: str, to: str | None, from_: str | None, params_path: str | None, allow_pickle: bool,
            no_verify: bool, overwrite: bool, shards: int | None) -> None:
    """Convert checkpoint SRC to DST (H5 <-> torch pickle <-> safetensors; --to vendor: the vendor's format 0.5;
    a decoder family's checkpoint <-> Hugging Face with --to hf / --from hf). SRC may be a sharded run's
    checkpoint folder (read whole: e.g. to one .mdl file); --to sharded --shards N writes one.

    A .pt written here loads with torch.load(weights_only=True); numpy values in it are tagged dicts
    that cs-run turns back into numpy values."""
    side = hf_folder.side_files(src) if from_ == "hf" and Path(src).is_dir() else []
    outputs = [Path(dst)] + ([Path(dst).with_suffix(".yaml")] + [Path(dst).parent / p.name for p in side]
                             if from_ == "hf" else [])
    existing = [str(p) for p in outputs if p.exists() or p.is_symlink()]
    # a checkpoint is the product of a run: never replaced by a typo (SRC itself: reported below)
    if existing and not overwrite and Path(dst).resolve() != Path(src).resolve():
        raise click.UsageError(f"{' and '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; "
                               "choose another DST, or pass --overwrite to replace it")
    if to == "hf" or from_ == "hf":
        if to == "hf" and from_ == "hf":
            raise click.UsageError("give --to hf or --from hf, not both")
        if to == "hf":  # the model's own converter (cs_run.registry), named by the run's params
            params = _run_params(Path(src), params_path)
            keys, prefix = decoder_of(_model_keys(params), str(params))  # a DPO run's: its policy
            side = _tokenizer_files(Path(src), params)
            out = hf_converter(keys.get("name"), f"params: model.name (of {params})").to_hf(src, dst, keys, side,
                                                                                            prefix=prefix)
            names = [p.name for p in side if p.name != hf_folder.GENERATION_CONFIG]
            click.echo(f"wrote {out} (Hugging Face: config.json, model.safetensors, generation_config.json"
                       f"{', ' + ', '.join(names) if names else '; no tokenizer found beside ' + str(params)}) "
                       f"with the model of {params}")
        else:
            model_type, where = _hf_model_type(Path(src))
            checkpoint, params = hf_converter(model_type, where).from_hf(src, dst)
            copied = hf_folder.copy_side_files(side, Path(dst).parent)
            click.echo(f"wrote {checkpoint} (h5) and its params {params}"
                       + (f"; copied {', '.join(p.name for p in copied)} beside it" if copied else ""))
        return

    fmt = run_convert(src, dst, to, allow_pickle=allow_pickle, verify=not no_verify, shards=shards)
    click.echo(f"wrote {dst} ({fmt})")


@checkpoint.command(cls=HelpCommand, examples=[
    ("format, global step, parameter count and every key", "cs-run checkpoint info model_dir/fc_mnist/checkpoint_100.mdl"),
    ("also check every tensor's CRC32 (exit 1 naming damaged keys)",
     "cs-run checkpoint info model_dir/fc_mnist/checkpoint_100.mdl --verify"),
    ("the same description as JSON", "cs-run checkpoint info model_dir/fc_mnist/checkpoint_100.mdl --json")])
@click.argument("path", type=click.Path(exists=True, dir_okay=True))
@click.option("--json", "as_json", is_flag=True, cls=Flag, default_text="off", help="Print the description as JSON.")
@click.option("--verify", is_flag=True, cls=Flag, default_text="off",
              help="Check every tensor's CRC32; exit 1 naming damaged keys.")
def info(path: str, as_json: bool, verify: bool) -> None:
    """Show the checkpoint at PATH: its format, global step and parameter count, then every key with
    its type, dtype and shape (or value) and size."""

    desc = run_info(path, verify=verify)
    if as_json:
        click.echo(json.dumps(desc, indent=2))
    else:
        name = desc["format"] if desc["version"] is None else f"{desc['format']} v{desc['version']}"
        step = desc["global_step"]
        scope = "under model." if any(k["key"].startswith("model.") for k in desc["keys"]) else "in the file"
        click.echo(f"{path}: {name}")
        click.echo(f"global step: {'-' if step is None else step}")
        click.echo(f"parameters:  {desc['num_parameters']:,} in {desc['parameter_tensors']} tensors {scope} "
                   "(buffers included)")
        click.echo("")
        width = max([len(k["key"]) for k in desc["keys"]] + [3])
        for k in desc["keys"]:
            detail = f"{k.get('dtype', '')}{k.get('shape', '')}"
            if "value" in k:
                shown = _show(k["value"], k.get("dtype"))
                detail = f"{detail} = {shown}" if detail else shown
            size = _human(k["nbytes"]) if k.get("nbytes") or k["type"] in ("tensor", "ndarray") else ""
            tied = f"  tied to {k['tied_to']}" if "tied_to" in k else ""
            click.echo(f"{k['key']:<{width}}  {k['type']:<8} {detail:<28} {size:>10}{tied}".rstrip())
        click.echo(
            f"{name}: {len(desc['keys'])} keys, "
            f"{desc['num_tensors']} tensors, {desc['total_bytes']} bytes ({_human(desc['total_bytes'])})"
        )
        if verify:
            unverified = f", {len(desc['unverified'])} unverified (no checksum recorded)" if desc["unverified"] else ""
            click.echo(f"checksums: {desc['verified']} good, {len(desc['damaged'])} damaged{unverified}")
    if verify and desc.get("damaged"):
        raise_if_damaged(path, desc["damaged"])
