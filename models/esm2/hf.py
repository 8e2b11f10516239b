"""esm2 checkpoints <-> Hugging Face ESM (``EsmForMaskedLM``, ``model_type: esm``) folders.

HF's ESM is the Model Zoo's ESM-2 with rotary positions over the whole head (``rotary_dim`` = hidden / heads),
pre-norm layers, a final norm (``emb_layer_norm_after``), erf GELU in the encoder and the MLM head, no NSP and
no pooler. Its RoPE rotates the two halves of each head where the Model Zoo rotates interleaved pairs, so the
q and k rows (weights and biases) are permuted per head both ways (:func:`cs_run.models.common.hf.
interleave_rotary`); every other tensor is copied as it is. HF's EsmModel also carries a contact-prediction head
that EsmForMaskedLM never calls: ``--to hf`` writes it as zeros and ``--from hf`` leaves it (it changes no logit).

Two differences at padded positions only (their logits, which no loss reads): HF zeroes the padded rows of its
input embeddings; the vendor does not. Any model HF cannot express (a partial rotary_dim, post-norm, NSP, no final
norm, another activation, learned positions) is refused by name when the written config is read back.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from cs_run.errors import ParamsError
from cs_run.models.bert.hf import layer_pairs
from cs_run.models.common.hf import (
    HF_BUFFERS,
    HFAdapter,
    Taker,
    assign,
    build,
    check_weights,
    deinterleave_rotary,
    interleave_rotary,
    params_file_text,
)

__all__ = ["hf_config", "model_keys_from_hf_config", "to_hf_state_dict", "from_hf_state_dict", "ADAPTER", "from_hf",
           "to_hf"]

_TRAINING_ONLY = ("mlm_loss_weight", "label_smoothing")  # HF's config has no place for them; no output changes
_LEGACY = re.compile(r"LayerNorm\.(gamma|beta)$")
_CONTACT_HEAD = ("esm.contact_head.regression.weight", "esm.contact_head.regression.bias")


def hf_config(c: dict) -> dict:
    """config.json of an esm2 model's resolved keys (:attr:`Esm2ForPreTrainingModel.config`)."""
    if c["position_embedding_type"] != "rotary":
        raise ParamsError(f"params: model.position_embedding_type: {c['position_embedding_type']!r} has no Hugging Face "
                          "esm equivalent here (ESM-2's rotary is); convert a model with rotary positions")
    return {
        "architectures": ["EsmForMaskedLM"], "model_type": "esm",
        "vocab_size": c["vocab_size"], "hidden_size": c["hidden_size"], "num_hidden_layers": c["num_hidden_layers"],
        "num_attention_heads": c["num_heads"], "intermediate_size": c["filter_size"],
        "hidden_dropout_prob": c["dropout_rate"],
        "attention_probs_dropout_prob": c["dropout_rate"] if c["attention_dropout_rate"] is None
        else c["attention_dropout_rate"],
        "max_position_embeddings": c["max_position_embeddings"], "rope_theta": c["rope_theta"],
        "initializer_range": c["initializer_range"], "layer_norm_eps": c["layer_norm_epsilon"],
        "position_embedding_type": c["position_embedding_type"], "emb_layer_norm_before": c["embedding_layer_norm"],
        "token_dropout": c["token_dropout"], "mask_token_id": c["mask_token_id"], "pad_token_id": c["pad_token_id"],
        "tie_word_embeddings": c["share_embedding_weights"],
    }


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` keys of an ESM config.json (ESM-2: rotary positions; ESM-1's learned ones are not read)."""
    if cfg.get("position_embedding_type", "absolute") != "rotary":
        raise ValueError("position_embedding_type (only 'rotary', ESM-2's, is read)")
    if cfg.get("is_folding_model"):
        raise ValueError("is_folding_model (ESMFold is not EsmForMaskedLM)")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    mask = cfg.get("mask_token_id")
    return {
        "name": "esm2", "vocab_size": int(cfg["vocab_size"]), "hidden_size": hidden,
        "num_hidden_layers": int(cfg["num_hidden_layers"]), "num_heads": heads,
        "filter_size": int(cfg["intermediate_size"]), "encoder_nonlinearity": "gelu", "mlm_nonlinearity": "gelu",
        "dropout_rate": float(cfg.get("hidden_dropout_prob", 0.1)),
        "attention_dropout_rate": float(cfg.get("attention_probs_dropout_prob", 0.1)),
        "layer_norm_epsilon": float(cfg.get("layer_norm_eps", 1e-12)),
        "initializer_range": float(cfg.get("initializer_range", 0.02)),
        "pad_token_id": int(cfg["pad_token_id"]), "mask_token_id": None if mask is None else int(mask),
        "token_dropout": bool(cfg.get("token_dropout", False)),
        "embedding_layer_norm": bool(cfg.get("emb_layer_norm_before") or False),
        "max_position_embeddings": int(cfg.get("max_position_embeddings", 1026)),
        "position_embedding_type": "rotary", "rotary_dim": hidden // heads,
        "rope_theta": float(cfg.get("rope_theta", 10000.0)),
        "share_embedding_weights": bool(cfg.get("tie_word_embeddings", True)),
        "disable_nsp": True, "norm_first": True, "use_final_layer_norm": True,
    }


def _names(model) -> list[tuple[str, str]]:
    """(HF tensor, our tensor) of every weight but the tied decoder and the contact head."""
    c, enc, mlm = model.config, "model.bert_encoder.", "model.bert_mlm_head."
    # EsmLayer has BertLayer's names but for its two pre-norms
    mods = [p for i in range(c["num_hidden_layers"])
            for p in layer_pairs(i, "esm.encoder.layer.", enc + "transformer_encoder.layers.",
                                 norms=("attention.LayerNorm", "LayerNorm"))]
    mods += [("esm.encoder.emb_layer_norm_after", enc + "transformer_encoder.norm"),
             ("lm_head.dense", mlm + "mlm_transform.ffn.ffn.0.linear_layer"), ("lm_head.layer_norm", mlm + "mlm_transform.ln")]
    if c["embedding_layer_norm"]:
        mods.append(("esm.embeddings.layer_norm", enc + "embed_ln_f"))
    pairs = [("esm.embeddings.word_embeddings.weight", enc + "embedding_layer.word_embeddings.weight"),
             ("lm_head.bias", mlm + "classifier.ffn.0.linear_layer.bias")]
    pairs += [(f"{h}.{k}", f"{o}.{k}") for h, o in mods for k in ("weight", "bias")]
    if not c["share_embedding_weights"]:
        pairs.append(("lm_head.decoder.weight", mlm + "classifier.ffn.0.linear_layer.weight"))
    return pairs


def _rotated(name: str) -> bool:
    return ".attention.self.query." in name or ".attention.self.key." in name


def to_hf_state_dict(model) -> dict[str, torch.Tensor]:
    """HF tensors of an esm2 model (the inverse of :func:`from_hf_state_dict`), the contact head as zeros."""
    sd, c = model.state_dict(), model.config
    out = {hf: deinterleave_rotary(sd[ours], c["num_heads"], c["rotary_dim"]) if _rotated(hf) else sd[ours]
           for hf, ours in _names(model)}
    word = sd["model.bert_encoder.embedding_layer.word_embeddings.weight"]
    out[_CONTACT_HEAD[0]] = word.new_zeros(1, c["num_hidden_layers"] * c["num_heads"])
    out[_CONTACT_HEAD[1]] = word.new_zeros(1)
    return out


def _legacy_names(names: dict) -> dict:
    """``LayerNorm.gamma`` / ``.beta`` read as ``.weight`` / ``.bias``: transformers 5 saves ESM's layer norms
    under the legacy names and loads both (its conversion_mapping "esm"); ``--to hf`` writes weight / bias."""
    return {_LEGACY.sub(lambda m: "LayerNorm." + ("weight" if m.group(1) == "gamma" else "bias"), k): v
            for k, v in names.items()}


def from_hf_state_dict(model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy HF ESM tensors into an esm2 model built from :func:`model_keys_from_hf_config`."""
    c, t = model.config, Taker(_legacy_names(tensors))
    mapped = {ours: interleave_rotary(t(hf), c["num_heads"], c["rotary_dim"]) if _rotated(hf) else t(hf)
              for hf, ours in _names(model)}
    for name in _CONTACT_HEAD + (("lm_head.decoder.weight",) if c["share_embedding_weights"] else ()):
        if name in t:  # the unused contact head; HF's tied copy of the decoder
            t(name)
    t.check_all_used()
    assign(model, mapped)


def runnable_params(keys: dict, hf_dir: Path, checkpoint: Path) -> str:
    """The params file ``--from hf`` writes beside the checkpoint: the folder's ``model:`` keys plus the Model
    Zoo's ESM-2 inputs (BertHDF5DataProcessor: data_dir to set), its Adam and a runconfig."""
    def data(shuffle: bool) -> dict:
        return {"data_processor": "BertHDF5DataProcessor", "data_dir": None, "batch_size": 8, "shuffle": shuffle,
                **({"shuffle_seed": 1} if shuffle else {}), "num_workers": 0}
    sections = {"train_input": data(True), "eval_input": data(False), "model": keys,
                "optimizer": {"optimizer_type": "Adam", "betas": [0.9, 0.98], "eps": 1.0e-8, "weight_decay": 0.01,
                              "learning_rate": 4.0e-5},
                "runconfig": {"max_steps": 1000, "log_steps": 10, "checkpoint_steps": 200, "seed": 1}}
    return params_file_text("esm2", hf_dir, checkpoint, sections,
                            "data_dir (the Model Zoo's BERT HDF5 shards of masked protein sequences).",
                            "a folder of BERT HDF5 shards")


class _EsmAdapter(HFAdapter):
    """The shared flow with ESM's layer names (and their legacy spellings) in the header check."""

    def check_header(self, found: dict[str, tuple], keys: dict, where: str) -> None:
        found = _legacy_names(found)
        layers = keys["num_hidden_layers"]
        in_file = sorted({int(m.group(1)) for name in found if (m := re.search(r"\.layer\.(\d+)\.", name))})
        meta = build({**keys, "num_hidden_layers": min(layers, len(found))}, meta=True)
        expected = {k: tuple(v.shape) for k, v in to_hf_state_dict(meta).items() if k not in _CONTACT_HEAD}
        optional = {_CONTACT_HEAD[0]: (1, layers * keys["num_heads"]), _CONTACT_HEAD[1]: (1,)}
        if keys.get("share_embedding_weights", True):
            optional["lm_head.decoder.weight"] = (keys["vocab_size"], keys["hidden_size"])
        check_weights(found, expected, optional, in_file, f"{layers} layer(s)", layers, where,
                      "layer count, sizes, tie_word_embeddings")


ADAPTER = _EsmAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict,
                      buffers=HF_BUFFERS + (".position_ids", ".inv_freq"), label="ESM", params_text=runnable_params,
                      training_only=_TRAINING_ONLY)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
