"""bert/classifier checkpoints <-> Hugging Face ``BertForSequenceClassification`` tensors.

The encoder's names are bert's (:mod:`cs_run.models.bert.hf`, under ``bert.`` here as there); the pooler is
``bert.pooler.dense`` and the head ``classifier``. HF's pooler is always tanh, so a model with another
``pooler_nonlinearity`` is refused by name. ``--to hf`` finds this module by ``model.name``; ``--from hf`` by
bert's (config.json's ``model_type`` is ``bert``), which hands a folder whose ``architectures`` name
BertForSequenceClassification to :data:`ADAPTER`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cs_run.errors import ParamsError
from cs_run.models.bert.hf import HF_ACTIVATIONS, layer_pairs
from cs_run.models.common.hf import HF_BUFFERS, HFAdapter, Taker, assign, params_file_text

__all__ = ["hf_config", "model_keys_from_hf_config", "to_hf_state_dict", "from_hf_state_dict", "ADAPTER",
           "from_hf", "to_hf", "head_names", "head_hf_config"]

_PROBLEM = {"single_label_classification": "single_label_classification", "regression": "regression"}


def head_hf_config(c: dict, architecture: str, classifier_dropout: float, num_labels: int) -> dict:
    """config.json of a BERT fine-tuning head's resolved keys (its ``config``): HF's ``architecture`` with the
    encoder keys both heads share and the head's dropout and label count (each head names them its own way)."""
    if c["encoder_nonlinearity"] not in HF_ACTIVATIONS:
        raise ParamsError(f"params: model.encoder_nonlinearity: {c['encoder_nonlinearity']!r} has no Hugging Face "
                          f"equivalent (HF knows {', '.join(HF_ACTIVATIONS)})")
    return {"architectures": [architecture], "model_type": "bert",
            "vocab_size": c["vocab_size"], "hidden_size": c["hidden_size"], "num_hidden_layers": c["num_hidden_layers"],
            "num_attention_heads": c["num_heads"], "intermediate_size": c["filter_size"],
            "hidden_act": c["encoder_nonlinearity"], "hidden_dropout_prob": c["dropout_rate"],
            "attention_probs_dropout_prob": c["attention_dropout_rate"], "classifier_dropout": classifier_dropout,
            "layer_norm_eps": c["layer_norm_epsilon"], "initializer_range": c["initializer_range"],
            "pad_token_id": c["embedding_pad_token_id"], "position_embedding_type": "absolute",
            "max_position_embeddings": c["max_position_embeddings"], "type_vocab_size": c["num_segments"],
            "num_labels": num_labels}


def hf_config(c: dict) -> dict:
    """config.json of a bert/classifier model's resolved keys (its ``config``)."""
    if c["pooler_nonlinearity"] != "tanh":
        raise ParamsError(f"params: model.pooler_nonlinearity: {c['pooler_nonlinearity']!r} has no Hugging Face "
                          "equivalent (BertPooler is tanh)")
    return {**head_hf_config(c, "BertForSequenceClassification", c["task_dropout"], c["num_labels"]),
            "problem_type": _PROBLEM[c["problem_type"]]}


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` keys of a BertForSequenceClassification config.json."""
    num_labels = int(cfg.get("num_labels", len(cfg.get("id2label") or {}) or 2))
    dropout = float(cfg.get("hidden_dropout_prob", 0.1))
    task = cfg.get("classifier_dropout")
    return {"name": "bert/classifier", "vocab_size": int(cfg["vocab_size"]), "hidden_size": int(cfg["hidden_size"]),
            "num_hidden_layers": int(cfg["num_hidden_layers"]), "num_heads": int(cfg["num_attention_heads"]),
            "filter_size": int(cfg["intermediate_size"]), "encoder_nonlinearity": cfg.get("hidden_act", "gelu"),
            "pooler_nonlinearity": "tanh", "dropout_rate": dropout,
            "attention_dropout_rate": float(cfg.get("attention_probs_dropout_prob", 0.1)),
            "task_dropout": dropout if task is None else float(task),
            "layer_norm_epsilon": float(cfg.get("layer_norm_eps", 1e-12)),
            "initializer_range": float(cfg.get("initializer_range", 0.02)),
            "embedding_pad_token_id": int(cfg.get("pad_token_id", 0)),
            "max_position_embeddings": int(cfg["max_position_embeddings"]),
            "num_segments": int(cfg.get("type_vocab_size", 2)), "num_labels": num_labels,
            "problem_type": "regression" if num_labels == 1 else "single_label_classification"}


def head_names(num_layers: int, pooler: bool = True) -> list[tuple[str, str]]:
    """(HF tensor, our tensor) of every weight of a BERT fine-tuning head model (``bert.`` and ``classifier``
    in HF, ``model.bert.`` and ``model.classifier`` in the vendor's): with the pooler (sequence classifier) or
    without (token classifier)."""
    enc = "model.bert."
    mods = [("embeddings.LayerNorm", "embed_ln_f")] + \
        ([("pooler.dense", "pooler.pooler.ffn.0.linear_layer")] if pooler else []) + \
        [p for i in range(num_layers) for p in layer_pairs(i)]
    pairs = [("bert.embeddings.word_embeddings.weight", enc + "embedding_layer.word_embeddings.weight"),
             ("bert.embeddings.position_embeddings.weight", enc + "embedding_layer.position_embeddings.embed.weight"),
             ("bert.embeddings.token_type_embeddings.weight", enc + "embedding_layer.segment_embeddings.weight")]
    pairs += [(f"bert.{h}.{k}", f"{enc}{o}.{k}") for h, o in mods for k in ("weight", "bias")]
    pairs += [(f"classifier.{k}", f"model.classifier.{k}") for k in ("weight", "bias")]
    return pairs


def to_hf_state_dict(model) -> dict[str, torch.Tensor]:
    """HF tensors of a bert/classifier or bert/token_classifier model (the inverse of :func:`from_hf_state_dict`)."""
    sd = model.state_dict()
    return {hf: sd[ours] for hf, ours in head_names(model.config["num_hidden_layers"], model.config["add_pooling_layer"])}


def from_hf_state_dict(model, tensors: dict[str, torch.Tensor]) -> None:
    """Copy BertForSequenceClassification (or, without a pooler, BertForTokenClassification) tensors into a model."""
    t = Taker(tensors)
    mapped = {ours: t(hf) for hf, ours in head_names(model.config["num_hidden_layers"], model.config["add_pooling_layer"])}
    t.check_all_used()
    assign(model, mapped)


def runnable_params(keys: dict, hf_dir: Path, checkpoint: Path) -> str:
    """The params file ``--from hf`` writes beside the checkpoint: the folder's ``model:`` keys plus GLUE
    inputs (SST2DataProcessor, or MNLIDataProcessor for three labels: data_dir and vocab_file to set), AdamW
    and a runconfig, as the Model Zoo's classifier files."""
    processor = "MNLIDataProcessor" if keys["num_labels"] == 3 else "SST2DataProcessor"

    def data(training: bool) -> dict:
        return {"data_processor": processor, "is_training": training, "data_dir": None, "vocab_file": None,
                "max_sequence_length": keys["max_position_embeddings"], "batch_size": 32, "shuffle": training,
                **({"shuffle_seed": 1} if training else {}), "do_lower": True, "num_workers": 0}
    sections = {"train_input": data(True), "eval_input": data(False), "model": keys,
                "optimizer": {"optimizer_type": "AdamW", "weight_decay": 0.01, "eps": 1.0e-6,
                              "max_gradient_norm": 1.0, "learning_rate": 1.0e-5},
                "runconfig": {"max_steps": 1000, "log_steps": 10, "checkpoint_steps": 200, "seed": 1}}
    return params_file_text("bert/classifier", hf_dir, checkpoint, sections,
                            'data_dir (a GLUE task folder of TSV files) and vocab_file.',
                            "a GLUE folder")


ADAPTER = HFAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict,
                    buffers=HF_BUFFERS + (".position_ids",), label="BERT", params_text=runnable_params)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
