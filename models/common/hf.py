"""Shared parts of the Hugging Face state-dict adapters (``models/<family>/hf.py``): the q/k row
permutation between HF's rotate-half RoPE and the Model Zoo's interleaved RoPE, and loading a
complete mapped state dict into a model with every parameter accounted for.

An adapter maps HF tensor names to this package's (the Model Zoo's) names; :func:`assign` then copies
them into a built :class:`~cs_run.models.common.lm.DecoderLMModel` (names relative to its ``model``),
refusing a missing, unused or misshapen tensor, so a conversion is complete or fails. A family's
:class:`HFAdapter` holds its config translation and tensor map; the conversion around them (folder,
header checks, checkpoint and params, the read-back of ``--to hf``) is the adapter's, once for all.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, make_dataclass
from pathlib import Path
from typing import Any, Callable, Container, Iterable, Optional

import torch
import yaml
from torch import nn

from cs_run.checkpoint import load, save
from cs_run.checkpoint.atomic import atomic_path
from cs_run.checkpoint.hf_folder import GENERATION_CONFIG, read_config, replaced_folder
from cs_run.errors import CheckpointError, ParamsError
from cs_run.lora_params import check_lora_params
from cs_run.models.common.lora import apply_lora, folded_state_dict
from cs_run.registry import check_model_keys, get_model_spec, resolve_object

__all__ = ["interleave_rotary", "deinterleave_rotary", "split_qkv_per_head", "fuse_qkv_per_head", "assign", "Taker",
           "give_renamed", "give_lm_head", "build", "HFAdapter", "load_checkpoint_model", "load_weights", "WEIGHTS",
           "HF_BUFFERS", "check_weights", "safetensors_module", "runnable_params", "params_file_text",
           "NOT_COMPUTED"]

logger = logging.getLogger(__name__)


def interleave_rotary(w: torch.Tensor, heads: int, rotary_dim: int) -> torch.Tensor:
    """HF rotate-half rows -> Model Zoo interleaved rows: per head, row 2j takes row j and row 2j+1 row
    j + rotary_dim/2 of the rotated part (the first ``rotary_dim`` rows); the rest stay. Works on
    weights [heads*head_dim, in] and biases [heads*head_dim]."""
    shape = w.shape
    t = w.reshape(heads, -1, *shape[1:])
    rot = t[:, :rotary_dim].reshape(heads, 2, rotary_dim // 2, *shape[1:]).transpose(1, 2)
    return torch.cat([rot.reshape(heads, rotary_dim, *shape[1:]), t[:, rotary_dim:]], dim=1).reshape(shape)


def deinterleave_rotary(w: torch.Tensor, heads: int, rotary_dim: int) -> torch.Tensor:
    """The inverse of :func:`interleave_rotary`."""
    shape = w.shape
    t = w.reshape(heads, -1, *shape[1:])
    rot = t[:, :rotary_dim].reshape(heads, rotary_dim // 2, 2, *shape[1:]).transpose(1, 2)
    return torch.cat([rot.reshape(heads, rotary_dim, *shape[1:]), t[:, rotary_dim:]], dim=1).reshape(shape)


def split_qkv_per_head(qkv: torch.Tensor, heads: int) -> list[torch.Tensor]:
    """q, k, v of a fused projection whose rows are grouped per head as [q, k, v] (GPT-NeoX, BLOOM)."""
    parts = qkv.reshape(heads, 3, -1, *qkv.shape[1:])
    return [parts[:, j].reshape(-1, *qkv.shape[1:]) for j in range(3)]


def fuse_qkv_per_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of :func:`split_qkv_per_head`."""
    shaped = [p.reshape(heads, -1, *p.shape[1:]) for p in (q, k, v)]
    return torch.stack(shaped, 1).reshape(-1, *q.shape[1:])


class Taker:
    """HF tensors by name; each may be taken once, and :meth:`check_all_used` names any left over."""

    def __init__(self, tensors: dict[str, torch.Tensor], ignore: tuple[str, ...] = ()) -> None:
        self.tensors = {k: v for k, v in tensors.items() if not k.endswith(ignore)}
        self.used: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def __call__(self, key: str) -> torch.Tensor:
        if key not in self.tensors:
            raise CheckpointError(f"Hugging Face weights: missing tensor {key!r}")
        self.used.add(key)
        return self.tensors[key].float()

    def lm_head(self, lm) -> dict[str, torch.Tensor]:
        """The output layer's weight of an untied ``lm``; a tied one takes HF's copy of the embedding (a
        folder may hold it) so that it does not count as unused."""
        if not lm.config["share_embedding_weights"]:
            return {"model.lm_head.weight": self("lm_head.weight")}
        if "lm_head.weight" in self:
            self("lm_head.weight")
        return {}

    def renamed(self, pairs: Iterable[tuple[str, str]], have: Container[str], hf_prefix: str = "",
                our_prefix: str = "") -> dict[str, torch.Tensor]:
        """Our name -> HF tensor of the weight and bias of each (HF module, our module) pair, those that the
        model has (``have``: its state-dict names); the inverse of :func:`give_renamed`."""
        return {ours: self(hf) for hf, ours in _renames(pairs, hf_prefix, our_prefix, have)}

    def check_all_used(self) -> None:
        left = sorted(set(self.tensors) - self.used)
        if left:
            raise CheckpointError(f"Hugging Face weights: {len(left)} tensor(s) have no place in the model, "
                                  f"e.g. {', '.join(left[:3])}")


def _renames(pairs: Iterable[tuple[str, str]], hf_prefix: str, our_prefix: str,
             have: Container[str]) -> list[tuple[str, str]]:
    """(HF name, our name) of each pair's weight and bias that the model has: the model built from the config
    decides both ways, so a tensor it has is required and one it lacks (a bias) is neither taken nor written."""
    return [(f"{hf_prefix}{hf}.{kind}", f"{our_prefix}{ours}.{kind}") for hf, ours in pairs
            for kind in ("weight", "bias") if f"{our_prefix}{ours}.{kind}" in have]


def give_renamed(sd: dict[str, torch.Tensor], pairs: Iterable[tuple[str, str]], hf_prefix: str = "",
                 our_prefix: str = "") -> dict[str, torch.Tensor]:
    """HF name -> tensor of the model's state dict ``sd``, for each (HF module, our module) pair's weight and
    bias it has: the inverse of :meth:`Taker.renamed`."""
    return {hf: sd[ours] for hf, ours in _renames(pairs, hf_prefix, our_prefix, sd)}


def give_lm_head(lm, sd: dict[str, torch.Tensor], name: str = "lm_head.weight",
                 ours: str = "model.lm_head.weight") -> dict[str, torch.Tensor]:
    """The output layer's weight (``ours`` in ``sd``) of an untied ``lm`` under HF's ``name``; nothing for a
    tied one (HF ties it to the embedding): the inverse of :meth:`Taker.lm_head`."""
    return {} if lm.config["share_embedding_weights"] else {name: sd[ours]}


def assign(model: nn.Module, mapped: dict[str, torch.Tensor]) -> None:
    """Copy ``mapped`` (full parameter names of ``model``) into it: every trainable parameter must be
    given once (tied ones through any of their names), with its shape."""
    params = dict(model.named_parameters(remove_duplicate=False))
    given: set[int] = set()
    with torch.no_grad():
        for name, value in mapped.items():
            if name not in params:
                raise CheckpointError(f"Hugging Face weights: the model has no parameter {name!r}")
            p = params[name]
            if tuple(p.shape) != tuple(value.shape):
                raise CheckpointError(f"Hugging Face weights: {name!r} has shape {list(value.shape)}, the model "
                                      f"{list(p.shape)}")
            p.copy_(value)
            given.add(id(p))
    missing = [n for n, p in params.items() if p.requires_grad and id(p) not in given]
    if missing:
        raise CheckpointError(f"Hugging Face weights: nothing for {', '.join(missing[:3])}")


# ------------------------------------------------------------------ the whole conversion, for every family

WEIGHTS = "model.safetensors"
# HF buffers some versions save beside the weights (causal masks, rotary tables): never parameters.
HF_BUFFERS = (".attn.bias", ".attn.masked_bias", ".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq",
              ".embed_positions")
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names
# Resolved keys that do not change what a converted model computes in eval (dropout, initializers, loss,
# inference and precision knobs): the rest must survive a trip through the HF config unchanged.
NOT_COMPUTED = ("dropout", "initializer", "lr_adjustment_groups", "loss_scaling", "loss_weight", "compute_eval_metrics",
                 "start_token", "loop_dim", "stop_sequences", "max_tokens", "temperature", "top_k", "top_p",
                 "dtype", "boundary_casting", "attention_softmax_fp32", "attention_kernel", "fold_rope_consts")


def safetensors_module():
    """``safetensors.torch``, or the error that says how to install it (an optional package)."""
    try:
        import safetensors.torch  # noqa: PLC0415 - optional package
    except ImportError:
        raise CheckpointError("the Hugging Face layout needs the 'safetensors' package; "
                              "pip install 'cs-run[safetensors]'") from None
    return safetensors.torch


def build(model_keys: dict, meta: bool = False):
    """The registered model of a ``model:`` section (on the meta device: shapes only, nothing allocated); its
    keys (an HF config's translation or a run's params) are checked against the family's config class."""
    spec = get_model_spec(model_keys["name"])
    fn = resolve_object(spec.model_fn)
    keys = {k: v for k, v in model_keys.items()
            if k not in ("name", "mixed_precision", "use_bfloat16", "fp16_type", "compute_eval_metrics")}
    check_model_keys(spec, keys, lambda key: "")
    try:
        if meta:
            with torch.device("meta"):
                return fn(**keys, compute_eval_metrics=False)
        return fn(**keys, compute_eval_metrics=False)
    except (TypeError, ValueError) as e:
        raise ParamsError(f"params: model: {e}") from None


def check_weights(found: dict[str, tuple], expected: dict[str, tuple], optional: dict[str, tuple],
                  in_file: list[int], said: str, layers: int, where: str, fix: str, layer_prefix: str = "") -> None:
    """The tensors ``found`` in an HF file (name -> shape) are the ``expected`` ones (plus the ``optional``,
    e.g. a tied head), for ``layers`` layers (the config ``said`` so; ``in_file``: the file's layer numbers).

    Raises:
        CheckpointError: at ``where``, naming a layer count that differs and the missing, unused and
            misshaped names (at most three of each), and the config.json keys to ``fix``.
    """
    problems = []
    if len(in_file) != layers or in_file[-1:] != [layers - 1]:  # never range(layers): it may be absurd
        span = (f"{len(in_file)} layer(s) ({layer_prefix}{in_file[0]} .. {layer_prefix}{in_file[-1]})"
                if in_file else "no layer")
        problems.append(f"config.json says {said} but the weights hold {span}")
    missing = [k for k in expected if k not in found]
    unused = [k for k in found if k not in expected and k not in optional]
    misshaped = [f"{k} is {list(found[k])}, the config says {list(shape)}"
                 for k, shape in {**expected, **optional}.items() if k in found and tuple(found[k]) != tuple(shape)]
    for label, names in (("missing", missing), ("not used by the config", unused), ("misshaped", misshaped)):
        if names:
            more = f", ... ({len(names)} in all)" if len(names) > 3 else ""
            problems.append(f"{label}: {', '.join(names[:3])}{more}")
    if problems:
        raise CheckpointError(f"{where}: the weights do not match config.json: {'; '.join(problems)}; fix "
                              f"config.json ({fix}) or give the weights written with it")


def _check_header(found: dict[str, tuple], keys: dict, to_state_dict, where: str) -> None:
    """``found`` (HF name -> shape, from the safetensors header) holds exactly the tensors of the model that
    ``keys`` describe, with their shapes; the expected ones come from that model built on the meta device
    (never more layers than the file has tensors, so an absurd config allocates nothing).

    Raises:
        CheckpointError: one line naming the missing, unused and misshaped tensors and what to fix.
    """
    layers = keys["num_hidden_layers"]
    in_file = sorted({int(m.group(1)) for name in found if (m := re.search(r"\.(?:h|layers?|blocks)\.(\d+)\.", name))})
    meta = build({**keys, "num_hidden_layers": min(layers, len(found))}, meta=True)
    expected = {k: tuple(v.shape) for k, v in to_state_dict(meta).items()}
    optional = {}
    if keys.get("share_embedding_weights") and "lm_head.weight" in expected:
        optional["lm_head.weight"] = expected.pop("lm_head.weight")  # save_pretrained may drop the tied copy
    elif keys.get("share_embedding_weights"):
        optional["lm_head.weight"] = (keys["vocab_size"], keys["hidden_size"])
    check_weights(found, expected, optional, in_file, f"{layers} layer(s)", layers, where,
                  "layer count, sizes, tie_word_embeddings")


def _first_difference(model, model_keys: dict, back_keys: dict) -> Optional[tuple[str, Any, Any]]:
    """``(key, ours, theirs)`` of the first computed key (dropout, initializers and other knobs that change no
    eval output aside) whose value in ``model`` (built of ``model_keys``) differs from the model ``back_keys``
    build; a section's key (moe) is named with its sub-key. None: the two compute the same."""
    back = {**back_keys, **build(back_keys, meta=True).config}
    for key, value in {**model_keys, **model.config}.items():  # raw keys: those a family keeps out of config
        if key == "name" or any(word in key for word in NOT_COMPUTED) or back.get(key) == value or \
                (key not in model.config and not value and not back.get(key)):
            continue
        if isinstance(value, dict) and isinstance(back.get(key), dict):  # a section (moe): name its key
            differ = [sub for sub in {**value, **back[key]} if value.get(sub) != back[key].get(sub)
                      and not any(word in sub for word in NOT_COMPUTED)]
            if not differ:
                continue
            return f"{key}.{differ[0]}", value.get(differ[0]), back[key].get(differ[0])
        return key, value, back.get(key)
    return None


def _check_expressible(model, model_keys: dict, hf_cfg: dict, keys_of) -> None:
    """The HF config says everything the model computes: the model its keys build has the same resolved
    keys (see :func:`_first_difference`).

    Raises:
        ParamsError: naming the first model key the HF family cannot express.
    """
    differs = _first_difference(model, model_keys, keys_of(hf_cfg))
    if differs:
        key, value, theirs = differs
        raise ParamsError(f"params: model.{key}: {value!r} has no Hugging Face {hf_cfg['model_type']} equivalent "
                          f"(its config gives {theirs!r}); convert a model without it")


def load_checkpoint_model(checkpoint: str | Path, model_keys: dict, what: str = "model", lora: Any = None,
                          prefix: str = ""):
    """The model ``model_keys`` describe, with the weights of ``checkpoint`` (every key, every shape); with
    ``lora`` (the run's model.lora_params), the checkpoint's adapters folded into them; with ``prefix``, the
    weights under it (a DPO checkpoint's ``policy_model.``), the prefix taken off.

    Raises:
        CheckpointError: the file is missing, holds no model weights, or does not fit the params' ``what``.
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.exists():  # a file, or a sharded run's checkpoint folder
        raise CheckpointError(f"checkpoint convert --to hf: {checkpoint} not found")
    model = build(model_keys)
    if lora is not None:  # a LoRA run's checkpoint: its adapters, folded into the weights below
        apply_lora(model, check_lora_params(lora))
    load_weights(model, checkpoint, what, prefix)
    return model if lora is None else _folded(model, model_keys)


def load_weights(model, checkpoint: str | Path, what: str = "model", prefix: str = ""):
    """``model`` with the weights of ``checkpoint`` (every key, every shape); see :func:`load_checkpoint_model`."""
    state = load(str(checkpoint))
    weights = state.get("model", state) if isinstance(state, dict) else None
    if not isinstance(weights, dict):
        raise CheckpointError(f"checkpoint {checkpoint}: no model weights (expected a 'model' state dict)")
    if prefix:
        weights = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
        if not weights:
            raise CheckpointError(f"checkpoint {checkpoint}: no weights under {prefix!r} (the params' {what}); give "
                                  "the params of the run that wrote it")
    try:
        missing, unexpected = model.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()},
                                                    strict=False)
    except RuntimeError as e:  # shape mismatches
        detail = str(e).splitlines()[-1].strip()
        raise CheckpointError(f"checkpoint {checkpoint} does not match the params' {what}: {detail}") from None
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {checkpoint} does not match the params' {what}: missing "
                              f"{', '.join(missing[:3]) or 'none'}; unexpected {', '.join(unexpected[:3]) or 'none'}")
    return model


def _folded(model: nn.Module, model_keys: dict) -> nn.Module:
    """The plain model whose weights are ``model``'s with its LoRA adapters folded in (the vendor's
    fold_lora_checkpoint). An adapted embedding tied to the LM head unties them, as the vendor's fold does:
    the head keeps the unadapted weights (what the LoRA model computed), the embedding the folded ones."""
    folded = folded_state_dict(model)
    plain = build(model_keys)
    plain.load_state_dict(folded)
    if any(not torch.equal(value, folded[key]) for key, value in plain.state_dict().items()):
        logger.warning("LoRA: the adapted embedding is tied to the LM head; the export unties them "
                       "(share_embedding_weights: false, tie_word_embeddings: false), as the vendor's fold does")
        plain = build({**model_keys, "share_embedding_weights": False})
        plain.load_state_dict(folded)
    return plain


def _same_layout(names: Iterable[str]) -> dict:
    return {}


@dataclass(frozen=True)
class HFAdapter:
    """One family's ``checkpoint convert --from hf`` / ``--to hf``. The family gives what differs (its config
    translation both ways, its tensor map both ways); the flow around them is written once here: the folder
    read and its safetensors header checked against the config both ways before anything is allocated, the
    checkpoint and its params written, and on the way out the HF config read back so that a model it cannot
    express is refused by name. A family module binds ``from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf``,
    the names :func:`cs_run.registry.hf_converter`'s callers use."""

    keys_of: Callable[[dict], dict]  # config.json -> model keys; a KeyError, TypeError, ... says a key is unusable
    hf_config: Callable[[dict], dict]  # a model's resolved keys -> config.json
    load_state_dict: Callable[[Any, dict], None]  # HF tensors (buffers left out) -> a model built of keys_of's keys
    to_state_dict: Callable[..., dict]  # a model -> its HF tensors
    # to_state_dict's keywords that lay the tensors out as in a file of these names (mixtral: fused experts)
    file_layout: Callable[[Iterable[str]], dict] = _same_layout
    buffers: tuple[str, ...] = HF_BUFFERS  # endings of the HF buffers a file may hold beside the weights
    label: str = ""  # the family, in what is said of its folder ("GPT-2"); empty: "model"
    what: str = "model"  # what a checkpoint that does not fit the params is said not to match
    # the params file --from hf writes (model keys, HF folder, checkpoint) -> text; None: runnable_params (GPT data)
    params_text: Optional[Callable[[dict, Path, Path], str]] = None
    # model keys of the loss or eval metric only: HF's config has no place for them, and they change no output
    training_only: tuple[str, ...] = ()

    def from_hf(self, hf_dir: str | Path, dst: str | Path, params_out: Optional[str | Path] = None) -> tuple[Path, Path]:
        """``--from hf``: the checkpoint ``dst`` of an HF folder and, beside it (or at ``params_out``), a
        runnable params file (:func:`runnable_params`); nothing is written unless the whole folder converts."""
        hf_dir, dst = Path(hf_dir), Path(dst)
        keys, model = self.read(hf_dir)
        params_out = Path(params_out) if params_out else dst.with_suffix(".yaml")
        save({"model": model.state_dict()}, str(dst))
        text = (self.params_text or runnable_params)(keys, hf_dir, dst)
        with atomic_path(str(params_out)) as tmp:
            Path(tmp).write_text(text)
        return dst, params_out

    def read(self, hf_dir: str | Path) -> tuple[dict, nn.Module]:
        """The model keys of an HF folder's ``config.json`` and the model they build, holding the folder's
        weights (checked against the config both ways before anything is allocated); nothing is written."""
        hf_dir = Path(hf_dir)
        cfg_path, weights_path = hf_dir / "config.json", hf_dir / WEIGHTS
        for path in (cfg_path, weights_path):
            if not os.path.lexists(path):
                raise CheckpointError(f"--from hf: {path} not found (expected a Hugging Face {self.label or 'model'} "
                                      f"folder with config.json and {WEIGHTS})")
        keys = self._read_keys(cfg_path)
        st = safetensors_module()
        try:  # the header alone: shapes are compared before anything is allocated
            if not weights_path.is_file():
                raise OSError("not a regular file")
            with st.safe_open(str(weights_path), "pt") as f:
                header = {k: f.get_slice(k) for k in f.keys() if not k.endswith(self.buffers)}
                found = {k: tuple(part.get_shape()) for k, part in header.items()}
                not_float = [f"{k} ({part.get_dtype()})" for k, part in header.items()
                             if part.get_dtype() not in _FLOAT_DTYPES]
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise CheckpointError(f"{weights_path}: not a readable safetensors file ({e})") from None
        if not_float:
            raise CheckpointError(f"{weights_path}: {', '.join(not_float[:3])}: not floating-point weights; give the "
                                  f"{self.label + ' ' if self.label else ''}weights this config.json goes with")
        try:
            self.check_header(found, keys, str(weights_path))
        except ParamsError as e:  # keys no model can have: config.json's fault, say so
            raise CheckpointError(f"{cfg_path}: {e} (the model keys this config.json gives)") from None
        model = self.build_model(keys)
        try:
            tensors = st.load_file(str(weights_path))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise CheckpointError(f"{weights_path}: not a readable safetensors file ({e})") from None
        self.load_state_dict(model, {k: v for k, v in tensors.items() if not k.endswith(self.buffers)})
        return keys, model

    def first_difference(self, model, model_keys: dict, hf_dir: str | Path) -> Optional[str]:
        """Why the HF folder's model is not ``model`` (built of the params' ``model_keys``): the first computed
        key whose value differs, as ``model.KEY: ours (config.json: theirs)``; None when the folder's
        config builds a model that computes the same."""
        keys = self._read_keys(Path(hf_dir) / "config.json")
        differs = _first_difference(model, model_keys, keys)
        return None if differs is None else f"model.{differs[0]}: {differs[1]!r} (config.json: {differs[2]!r})"

    def to_hf(self, checkpoint: str | Path, out_dir: str | Path, model_keys: dict,
              side: Iterable[Path] = (), prefix: str = "") -> Path:
        """``--to hf``: the folder ``out_dir`` of ``config.json`` (:attr:`hf_config` of the resolved keys),
        ``model.safetensors`` of a checkpoint whose model ``model_keys`` (the run's ``model:``) describe,
        ``generation_config.json`` and the tokenizer files among ``side``. The folder is built whole under a
        temporary name beside ``out_dir`` and renamed in (:func:`replaced_folder`): an existing ``out_dir``
        stays whole until then and keeps no file of its own. ``prefix``: the checkpoint's weights under it
        (a DPO checkpoint's policy)."""
        lora = model_keys.get("lora_params")  # the adapters are folded in: the export is a plain model
        model_keys = {k: v for k, v in model_keys.items() if k != "lora_params"}
        model = load_checkpoint_model(checkpoint, model_keys, self.what, lora, prefix)
        # the resolved keys, plus the raw ones a family keeps out of them (gptj's use_untied_layer_norm)
        config = self.hf_config({**model_keys, **model.config, "name": model_keys["name"]})
        self.check_expressible(model, model_keys, config)
        st = safetensors_module()
        side = list(side)
        tensors = {k: v.detach().contiguous().clone() for k, v in self.to_state_dict(model).items()}
        generation = _generation_config(side)
        with replaced_folder(out_dir) as tmp:
            try:
                st.save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
                (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
                (tmp / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2) + "\n")
                for src in side:
                    if src.name != GENERATION_CONFIG:
                        shutil.copyfile(src, tmp / src.name)
            except OSError as e:
                raise CheckpointError(f"cannot write {out_dir}: {e.strerror or e} (the old folder, if any, is "
                                      "unchanged)") from None
        return Path(out_dir)

    def _read_keys(self, cfg_path: Path) -> dict:
        """The model keys of ``config.json``, or one error saying what in it is unusable."""
        cfg = read_config(cfg_path, f"{self.label or 'Hugging Face'} config")
        try:
            return self.keys_of(cfg)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:  # a key absent, or not a usable number
            raise CheckpointError(f"{cfg_path}: missing or unusable key {e}; give the config.json written with "
                                  "these weights") from None

    # The three steps a family with its own rules replaces (gpt2: its table of shapes, no read-back).

    def check_header(self, found: dict[str, tuple], keys: dict, where: str) -> None:
        """``found`` (the file's names -> shapes) are the tensors of the model ``keys`` describe; see
        :func:`_check_header`."""
        _check_header(found, keys, lambda lm: self.to_state_dict(lm, **self.file_layout(found)), where)

    def build_model(self, keys: dict):
        return build(keys)

    def check_expressible(self, model, model_keys: dict, config: dict) -> None:
        """The HF ``config`` read back builds the model (:attr:`training_only` keys aside); see
        :func:`_check_expressible`."""
        if self.training_only:
            model = make_dataclass("Shown", ["config"])(
                {k: v for k, v in model.config.items() if k not in self.training_only})
            model_keys = {k: v for k, v in model_keys.items() if k not in self.training_only}
        _check_expressible(model, model_keys, config, self.keys_of)


# ------------------------------------------------------------------ what travels with a converted model

def runnable_params(model_keys: dict, hf_dir: Path, checkpoint: Path) -> str:
    """The params file ``--from hf`` writes beside the checkpoint: the folder's ``model:`` keys plus what a
    fine-tuning run needs (GptHDF5MapDataProcessor inputs, AdamW, a linear warmup into a cosine decay, a
    runconfig), so it runs as written once the two data_dir placeholders name shards."""
    def data(shuffle: bool) -> dict:
        return {"data_processor": "GptHDF5MapDataProcessor", "data_dir": None, "batch_size": 8,
                "shuffle": shuffle, **({"shuffle_seed": 1} if shuffle else {}), "num_workers": 0}
    sections = {
        "train_input": data(True),
        "eval_input": data(False),
        "model": model_keys,
        "optimizer": {"optimizer_type": "AdamW", "beta1": 0.9, "beta2": 0.95, "epsilon": 1.0e-8,
                      "weight_decay_rate": 0.01, "max_gradient_norm": 1.0,
                      "learning_rate": [{"scheduler": "Linear", "initial_learning_rate": 0.0,
                                         "end_learning_rate": 1.0e-4, "total_iters": 100},
                                        {"scheduler": "CosineDecay", "initial_learning_rate": 1.0e-4,
                                         "end_learning_rate": 1.0e-5, "total_iters": 900}]},
        "runconfig": {"max_steps": 1000, "log_steps": 10, "checkpoint_steps": 200, "seed": 1},
    }
    return params_file_text(model_keys["name"], hf_dir, checkpoint, sections,
                            "train_input.data_dir and eval_input.data_dir to shards\n"
                            "# tokenized with the tokenizer.json written beside this file:\n"
                            "#   cs-run data preprocess TEXT_FILES -o DIR --tokenizer tokenizer.json --eval_fraction 0.05",
                            "a folder of *.h5 shards")


def params_file_text(name: str, hf_dir: Path, checkpoint: Path, sections: dict, after_setting: str,
                     data_dir_is: Optional[str], **set_me: str) -> str:
    """A params file ``--from hf`` writes: where it came from and how to fine-tune from it (``after setting``
    the data), its ``sections``, and a ``SET ME`` naming what each unset ``data_dir`` must be (``data_dir_is``;
    None where the inputs have none) and each unset input key of ``set_me`` (llava's ``img_data_dir``, t5's
    ``src_data_dir``)."""
    head = (f"# {name} converted from the Hugging Face folder {hf_dir} (cs-run checkpoint convert --from hf).\n"
            f"# Fine-tune with: cs-run train --params THIS_FILE --checkpoint_path {checkpoint} --model_dir DIR\n"
            f"# after setting {after_setting}\n")
    text = "".join(yaml.safe_dump({k: v}, sort_keys=False) + "\n" for k, v in sections.items())
    for key, what in {"data_dir": data_dir_is, **set_me}.items():
        if what is not None:
            text = text.replace(f"  {key}: null\n", f"  {key}: null  # SET ME: {what}\n")
    return head + text


def _generation_config(side: list[Path]) -> dict:
    """``generation_config.json`` for ``--to hf``: the one among ``side`` (the files that came with the model),
    else transformers' from-model-config form with the tokenizer's bos and eos token ids where it names them."""
    by_name = {p.name: p for p in side}
    if GENERATION_CONFIG in by_name:
        return read_config(by_name[GENERATION_CONFIG], "generation config")
    out: dict[str, Any] = {"_from_model_config": True}
    if "tokenizer.json" in by_name and "tokenizer_config.json" in by_name:
        tok = read_config(by_name["tokenizer.json"], "tokenizer", max_bytes=1 << 30)  # Gemma's: 34 MB
        cfg = read_config(by_name["tokenizer_config.json"], "tokenizer config")
        vocab = {t.get("content"): t.get("id") for t in tok.get("added_tokens") or [] if isinstance(t, dict)}
        model_vocab = (tok.get("model") or {}).get("vocab")
        if isinstance(model_vocab, dict):
            vocab = {**model_vocab, **vocab}
        for name in ("bos_token", "eos_token", "pad_token"):
            token = cfg.get(name)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(vocab.get(token), int):
                out[f"{name}_id"] = vocab[token]
    return out
