"""dpr checkpoints <-> Hugging Face DPR, in the Model Zoo's layout for it (tools/checkpoint_converters/dpr.py,
Release 2.10): one folder holding two Hugging Face folders, ``q_encoder/`` (``DPRQuestionEncoder``) and
``ctx_encoder/`` (``DPRContextEncoder``), each a config.json (``model_type: dpr``) and its weights.

HF's DPR encoder is a BertModel without its pooler whose embedding is the first token's hidden state, which is
``pooler_type: cls`` here. HF's ``projection_dim`` (a linear layer after that) and this family's other poolers
(``mean``, ``ffn_pooler``) have no counterpart on the other side and are refused by name. One shared encoder
(``use_biencoder: false``) is written as two folders with the same weights; read back, it is two encoders.
The loss keys (``softmax_temperature``, ``mutual_information``) have no place in HF's config and change no
embedding: ``--from hf`` writes the vendor's defaults.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Iterable, Optional

import torch

from cs_run.checkpoint import save
from cs_run.checkpoint.atomic import atomic_path
from cs_run.checkpoint.hf_folder import read_config, replaced_folder
from cs_run.errors import CheckpointError, ParamsError
from cs_run.models.bert.hf import HF_ACTIVATIONS, layer_pairs
from cs_run.models.common.hf import (
    NOT_COMPUTED,
    WEIGHTS,
    Taker,
    assign,
    build,
    check_weights,
    load_checkpoint_model,
    params_file_text,
    safetensors_module,
)
from cs_run.models.dpr.model import encoder_config

__all__ = ["SIDES", "model_keys_from_hf_configs", "hf_configs", "from_hf", "to_hf"]

SIDES = (("q_encoder", "DPRQuestionEncoder", "question_encoder"), ("ctx_encoder", "DPRContextEncoder", "ctx_encoder"))
"""(subfolder and model key, HF architecture, HF tensor prefix) of the two encoders."""


def encoder_keys_from_hf(cfg: dict) -> dict:
    """One encoder's keys (``model.q_encoder`` / ``model.ctx_encoder``) of a DPR config.json."""
    if int(cfg.get("projection_dim", 0) or 0) > 0:
        raise ValueError("projection_dim (a projection after the first token's state: no dpr key has one; "
                         "only 0 is read)")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("position_embedding_type (only 'absolute' is read)")
    return {"vocab_size": int(cfg["vocab_size"]), "hidden_size": int(cfg["hidden_size"]),
            "num_hidden_layers": int(cfg["num_hidden_layers"]), "num_heads": int(cfg["num_attention_heads"]),
            "filter_size": int(cfg["intermediate_size"]), "encoder_nonlinearity": cfg.get("hidden_act", "gelu"),
            "dropout_rate": float(cfg.get("hidden_dropout_prob", 0.1)),
            "attention_dropout_rate": float(cfg.get("attention_probs_dropout_prob", 0.1)),
            "layer_norm_epsilon": float(cfg.get("layer_norm_eps", 1e-12)),
            "initializer_range": float(cfg.get("initializer_range", 0.02)),
            "pad_token_id": int(cfg.get("pad_token_id", 0) or 0),
            "max_position_embeddings": int(cfg["max_position_embeddings"]),
            "num_segments": int(cfg.get("type_vocab_size", 2))}


def model_keys_from_hf_configs(q_cfg: dict, ctx_cfg: dict) -> dict:
    """The ``model:`` keys of the two encoders' config.json files (a bi-encoder, ``pooler_type: cls``)."""
    return {"name": "dpr", "q_encoder": encoder_keys_from_hf(q_cfg), "ctx_encoder": encoder_keys_from_hf(ctx_cfg),
            "pooler_type": "cls"}


def _encoder_hf_config(keys: dict, where: str, architecture: str) -> dict:
    c = encoder_config(keys, where, add_pooling_layer=False)
    if c.encoder_nonlinearity not in HF_ACTIVATIONS:
        raise ParamsError(f"params: model.{where}.encoder_nonlinearity: {c.encoder_nonlinearity!r} has no Hugging "
                          f"Face equivalent (HF knows {', '.join(HF_ACTIVATIONS)} under these names)")
    return {"architectures": [architecture], "model_type": "dpr", "vocab_size": c.vocab_size,
            "hidden_size": c.hidden_size, "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_heads,
            "intermediate_size": c.filter_size, "hidden_act": c.encoder_nonlinearity,
            "hidden_dropout_prob": c.dropout_rate,
            "attention_probs_dropout_prob": c.dropout_rate if c.attention_dropout_rate is None
            else c.attention_dropout_rate,
            "max_position_embeddings": c.max_position_embeddings, "type_vocab_size": c.num_segments,
            "initializer_range": c.initializer_range, "layer_norm_eps": c.layer_norm_epsilon,
            "pad_token_id": c.pad_token_id, "position_embedding_type": "absolute", "projection_dim": 0}


def _encoder_keys(model_keys: dict) -> dict[str, dict]:
    """Each side's encoder keys: its own, or the shared ``encoder``'s."""
    return {side: model_keys.get(side) or model_keys["encoder"] for side, _, _ in SIDES}


def hf_configs(model_keys: dict) -> dict[str, dict]:
    """Each subfolder's config.json of a dpr model's keys.

    Raises:
        ParamsError: a key HF's DPR cannot express, named.
    """
    pooler = model_keys.get("pooler_type", "cls")
    if pooler != "cls":
        raise ParamsError(f"params: model.pooler_type: {pooler!r} has no Hugging Face DPR equivalent (its "
                          "embedding is the first token's state: pooler_type cls); convert a model without it")
    keys = _encoder_keys(model_keys)
    configs = {side: _encoder_hf_config(keys[side], side, arch) for side, arch, _ in SIDES}
    for side, _, _ in SIDES:  # read back: the config must build the encoder the params describe
        ours = dataclasses.asdict(encoder_config(keys[side], side, add_pooling_layer=False))
        back = dataclasses.asdict(encoder_config(encoder_keys_from_hf(configs[side]), side, add_pooling_layer=False))
        for key, value in ours.items():
            if back[key] != value and not any(word in key for word in NOT_COMPUTED):
                raise ParamsError(f"params: model.{side}.{key}: {value!r} has no Hugging Face dpr equivalent (its "
                                  f"config gives {back[key]!r}); convert a model without it")
    return configs


def _pairs(model_prefix: str, hf_prefix: str, layers: int) -> list[tuple[str, str]]:
    """(HF tensor, our tensor) of one encoder."""
    bert = hf_prefix + ".bert_model."
    mods = [("embeddings.LayerNorm", "embed_ln_f")] + [p for i in range(layers) for p in layer_pairs(i)]
    pairs = [(bert + "embeddings.word_embeddings.weight", model_prefix + "embedding_layer.word_embeddings.weight"),
             (bert + "embeddings.position_embeddings.weight",
              model_prefix + "embedding_layer.position_embeddings.embed.weight"),
             (bert + "embeddings.token_type_embeddings.weight", model_prefix + "embedding_layer.segment_embeddings.weight")]
    return pairs + [(f"{bert}{h}.{k}", f"{model_prefix}{o}.{k}") for h, o in mods for k in ("weight", "bias")]


def _our_prefix(model, side: str) -> str:
    shared = model.model.ctx_encoder is None
    return "model.question_encoder." if side == "q_encoder" or shared else "model.ctx_encoder."


def _side_pairs(model, model_keys: dict) -> dict[str, list[tuple[str, str]]]:
    keys = _encoder_keys(model_keys)
    return {side: _pairs(_our_prefix(model, side), prefix, keys[side]["num_hidden_layers"])
            for side, _, prefix in SIDES}


def _read_side(hf_dir: Path, side: str) -> tuple[dict, Path]:
    folder = hf_dir / side
    cfg_path, weights = folder / "config.json", folder / WEIGHTS
    for path in (cfg_path, weights):
        if not os.path.lexists(path):
            raise CheckpointError(f"--from hf: {path} not found (a DPR folder holds q_encoder/ and ctx_encoder/, each "
                                  f"a Hugging Face folder with config.json and {WEIGHTS}, as the Model Zoo's "
                                  "converter writes)")
    return read_config(cfg_path, "DPR config"), weights


def read(hf_dir: str | Path) -> tuple[dict, torch.nn.Module]:
    """The model keys of a DPR folder and the model they build, holding its weights; nothing is written."""
    hf_dir = Path(hf_dir)
    sides = {side: _read_side(hf_dir, side) for side, _, _ in SIDES}
    try:
        keys = model_keys_from_hf_configs(sides["q_encoder"][0], sides["ctx_encoder"][0])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{hf_dir}: a config.json has a missing or unusable key {e}; give the config.json "
                              "files written with these weights") from None
    st = safetensors_module()
    meta = build(keys, meta=True)
    tensors = {}
    for side, (_, weights) in sides.items():
        try:
            loaded = st.load_file(str(weights))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise CheckpointError(f"{weights}: not a readable safetensors file ({e})") from None
        loaded = {k: v for k, v in loaded.items() if not k.endswith(".position_ids")}
        pairs = _pairs(_our_prefix(meta, side), dict((s, p) for s, _, p in SIDES)[side],
                       keys[side]["num_hidden_layers"])
        shapes = dict(meta.state_dict())
        expected = {hf: tuple(shapes[ours].shape) for hf, ours in pairs}
        layers = keys[side]["num_hidden_layers"]
        in_file = sorted({int(name.split(".layer.")[1].split(".")[0]) for name in loaded if ".layer." in name})
        check_weights({k: tuple(v.shape) for k, v in loaded.items()}, expected, {}, in_file, f"{layers} layer(s)",
                      layers, str(weights), "num_hidden_layers, sizes")
        taker = Taker(loaded)
        tensors.update({ours: taker(hf) for hf, ours in pairs})
        taker.check_all_used()
    model = build(keys)
    assign(model, tensors)
    return keys, model


def runnable_params(keys: dict, hf_dir: Path, checkpoint: Path) -> str:
    """The params file ``--from hf`` writes: the model keys, DPRHDF5DataProcessor inputs to point at the
    Model Zoo's DPR HDF5 data, Adam and a runconfig (the vendor's params_dpr_base_nq.yaml's choices)."""
    def data(shuffle: bool) -> dict:
        return {"data_processor": "DPRHDF5DataProcessor", "data_dir": None, "batch_size": 8, "shuffle": shuffle,
                **({"shuffle_seed": 1} if shuffle else {}), "num_workers": 0}
    sections = {"train_input": data(True), "eval_input": data(False), "model": keys,
                "optimizer": {"optimizer_type": "Adam", "weight_decay": 0.0, "learning_rate": 1.0e-5,
                              "max_gradient_norm": 2.0},
                "runconfig": {"max_steps": 1000, "log_steps": 10, "checkpoint_steps": 200, "seed": 1}}
    return params_file_text("dpr", hf_dir, checkpoint, sections,
                            "data_dir (DPR HDF5 shards, as the Model Zoo's DPR preprocessing writes them).",
                            "a DPR HDF5 folder")


def from_hf(hf_dir: str | Path, dst: str | Path, params_out: Optional[str | Path] = None) -> tuple[Path, Path]:
    """``--from hf``: the checkpoint ``dst`` of a DPR folder and its params beside it (or at ``params_out``);
    nothing is written unless both encoders convert."""
    hf_dir, dst = Path(hf_dir), Path(dst)
    keys, model = read(hf_dir)
    params_out = Path(params_out) if params_out else dst.with_suffix(".yaml")
    save({"model": model.state_dict()}, str(dst))
    with atomic_path(str(params_out)) as tmp:
        Path(tmp).write_text(runnable_params(keys, hf_dir, dst))
    return dst, params_out


def to_hf(checkpoint: str | Path, out_dir: str | Path, model_keys: dict, side: Iterable[Path] = (),
          prefix: str = "") -> Path:
    """``--to hf``: the folder ``out_dir`` of ``q_encoder/`` and ``ctx_encoder/`` (config.json,
    model.safetensors, and the tokenizer files among ``side`` in each), built whole beside it and renamed in."""
    configs = hf_configs(model_keys)  # before the weights are read: a model HF cannot express stops here
    model = load_checkpoint_model(checkpoint, model_keys, "model", None, prefix)
    sd = model.state_dict()
    st = safetensors_module()
    side = list(side)
    with replaced_folder(out_dir) as tmp:
        try:
            for name, pairs in _side_pairs(model, model_keys).items():
                folder = tmp / name
                folder.mkdir()
                st.save_file({hf: sd[ours].detach().contiguous().clone() for hf, ours in pairs},
                             str(folder / WEIGHTS), metadata={"format": "pt"})
                (folder / "config.json").write_text(json.dumps(configs[name], indent=2) + "\n")
                for src in side:
                    (folder / src.name).write_bytes(src.read_bytes())
        except OSError as e:
            raise CheckpointError(f"cannot write {out_dir}: {e.strerror or e} (the old folder, if any, is "
                                  "unchanged)") from None
    return Path(out_dir)
