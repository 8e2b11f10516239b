"""bert checkpoints <-> Hugging Face BERT (``BertForPreTraining``) and RoBERTa (``RobertaForMaskedLM``) folders.

A ``bert`` model with NSP is HF's BertForPreTraining (``model_type: bert``); one with ``disable_nsp`` and
``mask_padding_in_positional_embed`` (the Model Zoo's roberta_large.yaml) is HF's RobertaForMaskedLM
(``model_type: roberta``): its positions are ``pad_token_id + 1..L`` for tokens and ``pad_token_id`` for
padding, the vendor's with an offset of ``pad_token_id``, so HF's ``max_position_embeddings`` is ours plus
``pad_token_id + 1``. HF's RoBERTa always adds a token-type embedding (one row, zeros when written here);
``--from hf`` folds that row into the position table (exact up to float rounding). Anything else HF cannot
express (no NSP without RoBERTa's positions, an MLM head activation other than the encoder's, a pooler other
than tanh, muP, pre-norm, ...) is refused by name when the written config is read back.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import torch

from cs_run.checkpoint import save
from cs_run.checkpoint.atomic import atomic_path
from cs_run.checkpoint.hf_folder import read_config
from cs_run.errors import ParamsError
from cs_run.models.common.hf import HF_BUFFERS, HFAdapter, Taker, assign, build, check_weights, params_file_text
from cs_run.registry import hf_converter

__all__ = ["HF_ACTIVATIONS", "layer_pairs",
           "hf_config", "model_keys_from_hf_config", "to_hf_state_dict", "from_hf_state_dict", "ADAPTER", "from_hf",
           "to_hf"]

# HF architectures of model_type bert that a head family of its own converts (model.name)
_HEADS = {"BertForSequenceClassification": "bert/classifier", "BertForTokenClassification": "bert/token_classifier"}
HF_ACTIVATIONS = ("gelu", "gelu_new", "relu", "silu", "tanh", "quick_gelu", "gelu_fast")
# training-only keys HF's config has no place for; they change no output
_TRAINING_ONLY = ("mlm_loss_weight", "label_smoothing")


def _roberta(c: dict) -> bool:
    return bool(c["disable_nsp"])


def hf_config(c: dict) -> dict:
    """config.json of a bert model's resolved keys (:attr:`BertForPreTrainingModel.config`)."""
    roberta = _roberta(c)
    if roberta and not c["mask_padding_in_positional_embed"]:
        raise ParamsError("params: model.disable_nsp: true without mask_padding_in_positional_embed has no Hugging "
                          "Face equivalent here (RobertaForMaskedLM's positions skip padding; BertForPreTraining "
                          "has NSP)")
    if c["encoder_nonlinearity"] not in HF_ACTIVATIONS:
        raise ParamsError(f"params: model.encoder_nonlinearity: {c['encoder_nonlinearity']!r} has no Hugging Face "
                          f"equivalent (HF knows {', '.join(HF_ACTIVATIONS)} under these names)")
    pad = c["pad_token_id"]
    out = {
        "vocab_size": c["vocab_size"], "hidden_size": c["hidden_size"], "num_hidden_layers": c["num_hidden_layers"],
        "num_attention_heads": c["num_heads"], "intermediate_size": c["filter_size"],
        "hidden_act": c["encoder_nonlinearity"], "hidden_dropout_prob": c["dropout_rate"],
        "attention_probs_dropout_prob": c["dropout_rate"] if c["attention_dropout_rate"] is None
        else c["attention_dropout_rate"],
        "layer_norm_eps": c["layer_norm_epsilon"], "initializer_range": c["initializer_range"],
        "pad_token_id": pad, "position_embedding_type": "absolute",
        "tie_word_embeddings": c["share_embedding_weights"],
    }
    if roberta:
        return {"architectures": ["RobertaForMaskedLM"], "model_type": "roberta", **out,
                "max_position_embeddings": c["max_position_embeddings"] + pad + 1, "type_vocab_size": 1}
    return {"architectures": ["BertForPreTraining"], "model_type": "bert", **out,
            "max_position_embeddings": c["max_position_embeddings"], "type_vocab_size": c["num_segments"]}


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` keys of a BERT or RoBERTa config.json."""
    roberta = cfg.get("model_type") == "roberta"
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("position_embedding_type (only 'absolute' is read)")
    pad = int(cfg.get("pad_token_id", 1 if roberta else 0))
    keys = {
        "name": "bert", "vocab_size": int(cfg["vocab_size"]), "hidden_size": int(cfg["hidden_size"]),
        "num_hidden_layers": int(cfg["num_hidden_layers"]), "num_heads": int(cfg["num_attention_heads"]),
        "filter_size": int(cfg["intermediate_size"]), "encoder_nonlinearity": cfg.get("hidden_act", "gelu"),
        "dropout_rate": float(cfg.get("hidden_dropout_prob", 0.1)),
        "attention_dropout_rate": float(cfg.get("attention_probs_dropout_prob", 0.1)),
        "layer_norm_epsilon": float(cfg.get("layer_norm_eps", 1e-12)),
        "initializer_range": float(cfg.get("initializer_range", 0.02)), "pad_token_id": pad,
        "share_embedding_weights": bool(cfg.get("tie_word_embeddings", True)),
    }
    if roberta:  # RobertaLMHead's transform is gelu whatever hidden_act says
        return {**keys, "disable_nsp": True, "mask_padding_in_positional_embed": True, "mlm_nonlinearity": "gelu",
                "max_position_embeddings": int(cfg["max_position_embeddings"]) - pad - 1}
    return {**keys, "pooler_nonlinearity": "tanh", "max_position_embeddings": int(cfg["max_position_embeddings"]),
            "num_segments": int(cfg.get("type_vocab_size", 2))}


def layer_pairs(i: int, hf: str = "encoder.layer.", ours: str = "transformer_encoder.layers.",
                norms: tuple[str, str] = ("attention.output.LayerNorm", "output.LayerNorm")) -> list[tuple[str, str]]:
    """(HF module, our module) of encoder layer ``i``: HF's BertLayer under ``hf``, ours under ``ours``.

    ``norms`` are HF's names of the layer's two LayerNorms (``norm1``, ``norm2``): ESM's layer is BERT's with
    its pre-norms named ``attention.LayerNorm`` and ``LayerNorm``.
    """
    h, o = f"{hf}{i}.", f"{ours}{i}."
    return [(h + "attention.self.query", o + "self_attn.proj_q_dense_layer"),
            (h + "attention.self.key", o + "self_attn.proj_k_dense_layer"),
            (h + "attention.self.value", o + "self_attn.proj_v_dense_layer"),
            (h + "attention.output.dense", o + "self_attn.proj_output_dense_layer"),
            (h + norms[0], o + "norm1"),
            (h + "intermediate.dense", o + "ffn.ffn.0.linear_layer"),
            (h + "output.dense", o + "ffn.ffn.1.linear_layer"),
            (h + norms[1], o + "norm2")]


def _names(model) -> list[tuple[str, str]]:
    """(HF tensor, our tensor) of every weight but the token-type embedding and the tied decoder."""
    roberta = _roberta(model.config)
    base, enc = ("roberta." if roberta else "bert."), "model.bert_encoder."
    mods = [("embeddings.LayerNorm", "embed_ln_f")] + \
        [p for i in range(model.config["num_hidden_layers"]) for p in layer_pairs(i)]
    if not roberta:
        mods.append(("pooler.dense", "pooler.pooler.ffn.0.linear_layer"))
    pairs = [(base + "embeddings.word_embeddings.weight", enc + "embedding_layer.word_embeddings.weight"),
             (base + "embeddings.position_embeddings.weight", enc + "embedding_layer.position_embeddings.embed.weight")]
    pairs += [(f"{base}{h}.{k}", f"{enc}{o}.{k}") for h, o in mods for k in ("weight", "bias")]
    head, mlm = ("lm_head." if roberta else "cls.predictions."), "model.bert_mlm_head."
    transform = [("dense", "mlm_transform.ffn.ffn.0.linear_layer"), ("layer_norm", "mlm_transform.ln")] if roberta \
        else [("transform.dense", "mlm_transform.ffn.ffn.0.linear_layer"), ("transform.LayerNorm", "mlm_transform.ln")]
    pairs += [(f"{head}{h}.{k}", f"{mlm}{o}.{k}") for h, o in transform for k in ("weight", "bias")]
    pairs.append((head + "bias", mlm + "classifier.ffn.0.linear_layer.bias"))
    if not model.config["share_embedding_weights"]:
        pairs.append((head + "decoder.weight", mlm + "classifier.ffn.0.linear_layer.weight"))
    if not roberta:
        pairs += [(f"cls.seq_relationship.{k}", f"model.bert_cls_head.classifier.ffn.0.linear_layer.{k}")
                  for k in ("weight", "bias")]
    return pairs


def to_hf_state_dict(model) -> dict[str, torch.Tensor]:
    """HF tensors of a bert model (the inverse of :func:`from_hf_state_dict`)."""
    sd = model.state_dict()
    out = {hf: sd[ours] for hf, ours in _names(model)}
    if _roberta(model.config):
        out["roberta.embeddings.token_type_embeddings.weight"] = torch.zeros(1, model.config["hidden_size"])
    else:
        out["bert.embeddings.token_type_embeddings.weight"] = sd["model.bert_encoder.embedding_layer.segment_embeddings"
                                                                 ".weight"]
    return out


def from_hf_state_dict(model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy HF BERT / RoBERTa tensors into a bert model built from :func:`model_keys_from_hf_config`."""
    t = Taker(tensors)
    mapped = {ours: t(hf) for hf, ours in _names(model)}
    if _roberta(model.config):  # one token type, always added: fold it into every position row
        position = "model.bert_encoder.embedding_layer.position_embeddings.embed.weight"
        mapped[position] = mapped[position] + t("roberta.embeddings.token_type_embeddings.weight")[0]
        tied = "lm_head.decoder."
    else:
        mapped["model.bert_encoder.embedding_layer.segment_embeddings.weight"] = \
            t("bert.embeddings.token_type_embeddings.weight")
        tied = "cls.predictions.decoder."
    for name in (tied + "bias",) + ((tied + "weight",) if model.config["share_embedding_weights"] else ()):
        if name in t:  # HF's tied copies (of the MLM bias, of a tied decoder), when the file holds them
            t(name)
    t.check_all_used()
    assign(model, mapped)


def runnable_params(keys: dict, hf_dir: Path, checkpoint: Path) -> str:
    """The params file ``--from hf`` writes beside the checkpoint: the folder's ``model:`` keys plus BERT CSV
    inputs (BertCSVDynamicMaskDataProcessor: data_dir and vocab_file to set), AdamW and a runconfig."""
    def data(shuffle: bool) -> dict:
        return {"data_processor": "BertCSVDynamicMaskDataProcessor", "data_dir": None, "vocab_file": None,
                "max_sequence_length": keys["max_position_embeddings"], "max_predictions_per_seq": 20,
                "batch_size": 8, "shuffle": shuffle, **({"shuffle_seed": 1} if shuffle else {}), "num_workers": 0}
    sections = {"train_input": data(True), "eval_input": data(False), "model": keys,
                "optimizer": {"optimizer_type": "AdamW", "weight_decay_rate": 0.01, "max_gradient_norm": 1.0,
                              "learning_rate": 1.0e-5},
                "runconfig": {"max_steps": 1000, "log_steps": 10, "checkpoint_steps": 200, "seed": 1}}
    return params_file_text("bert", hf_dir, checkpoint, sections,
                            "data_dir (the Model Zoo's BERT CSV folders, with meta.dat) and vocab_file.",
                            "a BERT CSV folder")


class _BertAdapter(HFAdapter):
    """The shared flow with BERT's layer names in the header check, BERT inputs in the params written, and a
    fine-tuning head's folder handed to that head's converter."""

    def from_hf(self, hf_dir, dst, params_out: Optional[str] = None) -> tuple[Path, Path]:
        hf_dir, dst = Path(hf_dir), Path(dst)
        head = _HEADS.get(next(iter(read_config(hf_dir / "config.json", "BERT config").get("architectures") or []),
                               None))
        if head is not None:  # a fine-tuning head's folder (model_type bert too): that family's converter
            return hf_converter(head, f"{hf_dir / 'config.json'}: architectures").from_hf(hf_dir, dst, params_out)
        keys, model = self.read(hf_dir)
        params_out = Path(params_out) if params_out else dst.with_suffix(".yaml")
        save({"model": model.state_dict()}, str(dst))
        with atomic_path(str(params_out)) as tmp:
            Path(tmp).write_text(runnable_params(keys, hf_dir, dst))
        return dst, params_out

    def check_header(self, found: dict[str, tuple], keys: dict, where: str) -> None:
        layers = keys["num_hidden_layers"]
        in_file = sorted({int(m.group(1)) for name in found if (m := re.search(r"\.layer\.(\d+)\.", name))})
        meta = build({**keys, "num_hidden_layers": min(layers, len(found))}, meta=True)
        expected = {k: tuple(v.shape) for k, v in to_hf_state_dict(meta).items()}
        head = "lm_head." if keys.get("disable_nsp") else "cls.predictions."
        optional = {head + "decoder.bias": (keys["vocab_size"],)}
        if keys.get("share_embedding_weights", True):
            optional[head + "decoder.weight"] = (keys["vocab_size"], keys["hidden_size"])
        check_weights(found, expected, optional, in_file, f"{layers} layer(s)", layers, where,
                      "layer count, sizes, tie_word_embeddings")


ADAPTER = _BertAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict,
                       buffers=HF_BUFFERS + (".position_ids",), label="BERT", training_only=_TRAINING_ONLY)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
