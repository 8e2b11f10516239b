"""t5 <-> Hugging Face T5 (``T5ForConditionalGeneration``): the model keys of an HF config and the tensor map,
through the decoders' adapter (:class:`cs_run.models.common.hf.HFAdapter`).

Names: ``shared`` -> ``encoder_embeddings.word_embeddings`` (the decoder's is the same module);
``{encoder,decoder}.block.0.layer.0.SelfAttention.relative_attention_bias`` -> ``{encoder,decoder}_embeddings.
position_embed_helper.relative_attention_bias`` (HF keeps it in block 0, the Model Zoo in the embedding); per
block ``layer.0.SelfAttention.{q,k,v,o}`` -> ``self_attn.proj_{q,k,v,output}_dense_layer``, ``layer.0.layer_norm``
-> ``norm1``; the decoder's ``layer.1.EncDecAttention`` -> ``multihead_attn`` with ``layer.1.layer_norm`` ->
``norm2``; the FFN (``layer.1`` in the encoder, ``layer.2`` in the decoder) ``DenseReluDense.wi`` / ``wo`` ->
``ffn.ffn.0`` / ``ffn.ffn.1`` and its ``layer_norm`` -> ``norm2`` / ``norm3``; ``final_layer_norm`` -> ``norm``;
``lm_head`` -> ``lm_head`` when untied. HF's T5 is pre-RMSNorm, relative-bias (max distance 128), unscaled,
bias-free and shares one embedding: a model outside that is refused by the key that differs.
"""

from __future__ import annotations

import re
from dataclasses import make_dataclass
from pathlib import Path

import torch

from cs_run.errors import CheckpointError, ParamsError
from cs_run.models.common.hf import HFAdapter, Taker, assign, build, check_weights, params_file_text

__all__ = ["model_keys_from_hf_config", "from_hf_state_dict", "to_hf_state_dict", "hf_config", "runnable_params",
           "from_hf", "to_hf", "ADAPTER"]

_M = "model."
_ATTN = (("q", "proj_q_dense_layer"), ("k", "proj_k_dense_layer"), ("v", "proj_v_dense_layer"),
         ("o", "proj_output_dense_layer"))
_BIAS = "layer.0.SelfAttention.relative_attention_bias.weight"
# keys that change no eval output and that HF's config need not carry
_TRAINING_ONLY = ("label_smoothing", "decoder_start_token_id", "use_cache")
# with relative positions, the lengths a params file may give (or take from its input, keys_from_input) change nothing
_FIXED_POSITION_LENGTHS = ("src_max_position_embeddings", "tgt_max_position_embeddings")
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu"}  # HF feed_forward_proj <-> the Model Zoo's nonlinearity


def _layer_pairs(stack: str) -> list[tuple[str, str]]:
    """(HF name, our name) of one block's weights, ``{i}`` for the block number."""
    hf, ours = f"{stack}.block.{{i}}.", f"{_M}{stack}.layers.{{i}}."
    pairs = [(f"{hf}layer.0.SelfAttention.{a}.weight", f"{ours}self_attn.{b}.weight") for a, b in _ATTN]
    pairs.append((f"{hf}layer.0.layer_norm.weight", f"{ours}norm1.weight"))
    ffn = "layer.1"
    if stack == "decoder":
        pairs += [(f"{hf}layer.1.EncDecAttention.{a}.weight", f"{ours}multihead_attn.{b}.weight") for a, b in _ATTN]
        pairs.append((f"{hf}layer.1.layer_norm.weight", f"{ours}norm2.weight"))
        ffn = "layer.2"
    pairs += [(f"{hf}{ffn}.DenseReluDense.wi.weight", f"{ours}ffn.ffn.0.linear_layer.weight"),
              (f"{hf}{ffn}.DenseReluDense.wo.weight", f"{ours}ffn.ffn.1.linear_layer.weight"),
              (f"{hf}{ffn}.layer_norm.weight", f"{ours}norm{3 if stack == 'decoder' else 2}.weight")]
    return pairs


def _pairs(config: dict) -> list[tuple[str, str]]:
    """Every (HF name, our name) of a model with these resolved keys, the tied head aside."""
    out = [("shared.weight", _M + "encoder_embeddings.word_embeddings.weight")]
    for stack, n in (("encoder", config["encoder_num_hidden_layers"]), ("decoder", config["decoder_num_hidden_layers"])):
        out.append((f"{stack}.block.0.{_BIAS}", f"{_M}{stack}_embeddings.position_embed_helper."
                                                "relative_attention_bias.weight"))
        out += [(hf.format(i=i), ours.format(i=i)) for i in range(n) for hf, ours in _layer_pairs(stack)]
        out.append((f"{stack}.final_layer_norm.weight", f"{_M}{stack}.norm.weight"))
    return out


def _scaled(cfg: dict) -> bool:
    """Whether HF scales the decoder output by d_model ** -0.5 (transformers 5's ``scale_decoder_outputs``; 4's
    ``tie_word_embeddings``): the Model Zoo's tied head. Unscaled (T5 v1.1) is an untied head here."""
    return bool(cfg.get("scale_decoder_outputs", cfg.get("tie_word_embeddings", True)))


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` section (Model Zoo keys) of an HF T5 config."""
    proj = cfg.get("feed_forward_proj", "relu")
    if proj not in _ACTIVATIONS:  # gated-gelu is gelu_new (tanh), which no Model Zoo T5 nonlinearity computes
        raise ValueError(f"feed_forward_proj {proj!r}: cs-run's t5 converts relu and gelu")
    if int(cfg.get("relative_attention_max_distance", 128)) != 128:
        raise ValueError("relative_attention_max_distance (the Model Zoo's T5 buckets up to 128)")
    layers = cfg["num_layers"]
    return {
        "name": "t5", "src_vocab_size": cfg["vocab_size"], "extra_ids": 0, "d_model": cfg["d_model"],
        "d_kv": cfg["d_kv"], "d_ff": cfg["d_ff"], "encoder_num_hidden_layers": layers,
        "decoder_num_hidden_layers": cfg.get("num_decoder_layers") or layers, "num_heads": cfg["num_heads"],
        "relative_attention_num_buckets": cfg.get("relative_attention_num_buckets", 32), "norm_type": "rmsnorm",
        "dropout_rate": float(cfg.get("dropout_rate", 0.1)), "layer_norm_epsilon": float(cfg.get("layer_norm_epsilon", 1e-6)),
        "initializer_factor": float(cfg.get("initializer_factor", 1.0)), "encoder_nonlinearity": _ACTIVATIONS[proj],
        "decoder_nonlinearity": _ACTIVATIONS[proj], "use_projection_bias_in_attention": False,
        "position_embedding_type": "relative", "share_encoder_decoder_embedding": True,
        "share_embedding_weights": _scaled(cfg), "use_ffn_bias": False,
        "use_pre_encoder_decoder_layer_norm": True, "use_pre_encoder_decoder_dropout": False,
        "use_dropout_outside_residual_path": True, "use_transformer_initialization": False,
        "pad_token_id": int(cfg.get("pad_token_id", 0) or 0),
        "decoder_start_token_id": cfg.get("decoder_start_token_id", 0),
    }


def from_hf_state_dict(model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy HF T5ForConditionalGeneration tensors into ``model`` (built from :func:`model_keys_from_hf_config`)."""
    t = Taker(tensors)
    out = {ours: t(hf) for hf, ours in _pairs(model.config)}
    for tied in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        if tied in t:  # some files keep the tied copies: taken, never used
            t(tied)
    head = t("lm_head.weight") if "lm_head.weight" in t else None
    if not model.config["share_embedding_weights"]:  # transformers 5 writes no head: it is the embedding
        out[_M + "lm_head.weight"] = out[_M + "encoder_embeddings.word_embeddings.weight"] if head is None else head
    t.check_all_used()
    assign(model, out)


def to_hf_state_dict(model) -> dict[str, torch.Tensor]:
    """HF T5ForConditionalGeneration tensors of a t5 model (the inverse of :func:`from_hf_state_dict`)."""
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = {hf: sd[ours].contiguous().clone() for hf, ours in _pairs(model.config)}
    if not model.config["share_embedding_weights"]:
        head = sd[_M + "lm_head.weight"]
        # a head equal to the embedding is written once, as transformers 5 writes T5 (whose head is always shared)
        if head.is_meta or not torch.equal(head, out["shared.weight"]):
            out["lm_head.weight"] = head.contiguous().clone()
    return out


def hf_config(config: dict) -> dict:
    """The HF ``config.json`` (T5ForConditionalGeneration) of a model's resolved keys."""
    act = config["encoder_nonlinearity"]
    return {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
        "vocab_size": config["src_vocab_size"] + config["extra_ids"], "d_model": config["d_model"],
        "d_kv": config["d_kv"], "d_ff": config["d_ff"], "num_layers": config["encoder_num_hidden_layers"],
        "num_decoder_layers": config["decoder_num_hidden_layers"], "num_heads": config["num_heads"],
        "relative_attention_num_buckets": config["relative_attention_num_buckets"],
        "relative_attention_max_distance": 128, "dropout_rate": config["dropout_rate"],
        "layer_norm_epsilon": config["layer_norm_epsilon"], "initializer_factor": config["initializer_factor"],
        "feed_forward_proj": act,  # a GLU one is refused before (check_expressible)
        # transformers 5 reads scale_decoder_outputs and ties the head to the embedding whatever it is told;
        # transformers 4 reads an untied, unscaled head from tie_word_embeddings false
        "tie_word_embeddings": config["share_embedding_weights"],
        "scale_decoder_outputs": config["share_embedding_weights"], "is_encoder_decoder": True,
        "pad_token_id": config["pad_token_id"], "eos_token_id": 1,
        "decoder_start_token_id": config["decoder_start_token_id"] or 0, "torch_dtype": "float32",
    }


def runnable_params(model_keys: dict, hf_dir: Path, checkpoint: Path) -> str:
    """The params file ``--from hf`` writes beside the checkpoint: the folder's ``model:`` keys plus
    T5DynamicDataProcessor inputs (placeholders for the text folder and vocabulary), AdaFactor's stand-in Adam
    and a runconfig."""
    def data(split: str) -> dict:
        return {"data_processor": "T5DynamicDataProcessor", "src_vocab_file": None, "src_data_dir": None,
                "extra_ids": 0, "src_max_sequence_length": 512, "tgt_max_sequence_length": 114, "batch_size": 8,
                "shuffle": split == "train", "shuffle_seed": 1, "num_workers": 0}
    sections = {"train_input": data("train"), "eval_input": data("eval"), "model": model_keys,
                "optimizer": {"optimizer_type": "Adam", "learning_rate": 1.0e-4, "max_gradient_norm": 1.0},
                "runconfig": {"max_steps": 1000, "log_steps": 10, "checkpoint_steps": 200, "seed": 1}}
    return params_file_text(model_keys["name"], hf_dir, checkpoint, sections,
                            "src_vocab_file and src_data_dir of both inputs.", None,
                            src_data_dir="a folder of text files", src_vocab_file="the vocabulary file")


class _T5Adapter(HFAdapter):
    """The shared flow with T5's two stacks in the header check."""

    def check_header(self, found: dict[str, tuple], keys: dict, where: str) -> None:
        n_enc, n_dec = keys["encoder_num_hidden_layers"], keys["decoder_num_hidden_layers"]
        in_file = {s: sorted({int(m.group(1)) for name in found if (m := re.match(rf"{s}\.block\.(\d+)\.", name))})
                   for s in ("encoder", "decoder")}
        meta = build({**keys, "encoder_num_hidden_layers": min(n_enc, len(found)),
                      "decoder_num_hidden_layers": min(n_dec, len(found))}, meta=True)
        expected = {k: tuple(v.shape) for k, v in to_hf_state_dict(meta).items()}
        width = (keys["src_vocab_size"], keys["d_model"])
        optional = {"encoder.embed_tokens.weight": width, "decoder.embed_tokens.weight": width,
                    "lm_head.weight": width}  # tied, or untied and written (or not: then it is the embedding)
        expected.pop("lm_head.weight", None)
        dec = in_file["decoder"]
        if len(dec) != n_dec or dec[-1:] != [n_dec - 1]:
            raise CheckpointError(f"{where}: the weights do not match config.json: num_decoder_layers says {n_dec} "
                                  f"but the weights hold {len(dec)} decoder block(s); fix config.json or give the "
                                  "weights written with it")
        check_weights(found, expected, optional, in_file["encoder"], f"num_layers {n_enc}", n_enc, where,
                      "num_layers, sizes, tie_word_embeddings", "encoder.block.")

    def check_expressible(self, model, model_keys: dict, config: dict) -> None:
        act = model.config["encoder_nonlinearity"]
        if act not in _ACTIVATIONS:
            raise ParamsError(f"params: model.encoder_nonlinearity: {act!r} has no Hugging Face t5 equivalent (its "
                              "gated-gelu is the tanh GELU); convert a relu or gelu model")
        if model.config.get("position_embedding_type") != "fixed":  # the lengths of fixed positions: unused here
            model = make_dataclass("Shown", ["config"])(
                {k: v for k, v in model.config.items() if k not in _FIXED_POSITION_LENGTHS})
            model_keys = {k: v for k, v in model_keys.items() if k not in _FIXED_POSITION_LENGTHS}
        super().check_expressible(model, model_keys, config)


ADAPTER = _T5Adapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict, label="T5",
                     params_text=runnable_params, training_only=_TRAINING_ONLY)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
