"""bert/token_classifier checkpoints <-> Hugging Face ``BertForTokenClassification`` folders: the tensors are
bert/classifier's without the pooler (:func:`cs_run.models.bert_classifier.hf.head_names`). ``--to hf``
finds this module by ``model.name``; ``--from hf`` by bert's, which hands it a ``model_type: bert`` folder whose
``architectures`` name BertForTokenClassification."""

from __future__ import annotations

from pathlib import Path

from cs_run.models.bert_classifier.hf import from_hf_state_dict, head_hf_config, to_hf_state_dict
from cs_run.models.common.hf import HF_BUFFERS, HFAdapter, params_file_text

# keys of the loss and the eval metric only: HF's config has no place for them, and they change no logits
_TRAINING_ONLY = ("include_padding_in_loss", "label_vocab_file")

__all__ = ["hf_config", "model_keys_from_hf_config", "ADAPTER", "from_hf", "to_hf"]


def hf_config(c: dict) -> dict:
    """config.json of a bert/token_classifier model's resolved keys (its ``config``)."""
    return head_hf_config(c, "BertForTokenClassification", c["encoder_output_dropout_rate"], c["num_classes"])


def model_keys_from_hf_config(cfg: dict) -> dict:
    """The ``model:`` keys of a BertForTokenClassification config.json."""
    dropout = float(cfg.get("hidden_dropout_prob", 0.1))
    task = cfg.get("classifier_dropout")
    return {"name": "bert/token_classifier", "vocab_size": int(cfg["vocab_size"]),
            "hidden_size": int(cfg["hidden_size"]), "num_hidden_layers": int(cfg["num_hidden_layers"]),
            "num_heads": int(cfg["num_attention_heads"]), "filter_size": int(cfg["intermediate_size"]),
            "encoder_nonlinearity": cfg.get("hidden_act", "gelu"), "dropout_rate": dropout,
            "attention_dropout_rate": float(cfg.get("attention_probs_dropout_prob", 0.1)),
            "encoder_output_dropout_rate": dropout if task is None else float(task),
            "layer_norm_epsilon": float(cfg.get("layer_norm_eps", 1e-12)),
            "initializer_range": float(cfg.get("initializer_range", 0.02)),
            "embedding_pad_token_id": int(cfg.get("pad_token_id", 0)),
            "max_position_embeddings": int(cfg["max_position_embeddings"]),
            "num_segments": int(cfg.get("type_vocab_size", 2)),
            "num_classes": int(cfg.get("num_labels", len(cfg.get("id2label") or {}) or 2))}


def runnable_params(keys: dict, hf_dir: Path, checkpoint: Path) -> str:
    """The params file ``--from hf`` writes: the model keys plus BertTokenClassifierDataProcessor inputs
    (data_dir, vocab_file and label_vocab_file to set), Adam and a runconfig, as bert_base_ner_bc5cdr_chem.yaml."""
    def data(training: bool) -> dict:
        return {"data_processor": "BertTokenClassifierDataProcessor", "data_dir": None, "vocab_file": None,
                "max_sequence_length": keys["max_position_embeddings"], "batch_size": 32, "shuffle": training,
                "num_workers": 0}
    sections = {"train_input": data(True), "eval_input": data(False), "model": keys,
                "optimizer": {"optimizer_type": "Adam", "eps": 1.0e-6, "max_gradient_norm": 1.0,
                              "learning_rate": 1.0e-5},
                "runconfig": {"max_steps": 1000, "log_steps": 10, "checkpoint_steps": 200, "seed": 1}}
    return params_file_text("bert/token_classifier", hf_dir, checkpoint, sections,
                            'data_dir (NER CSV folders with meta.dat) and vocab_file.',
                            "an NER CSV folder")


ADAPTER = HFAdapter(model_keys_from_hf_config, hf_config, from_hf_state_dict, to_hf_state_dict,
                    buffers=HF_BUFFERS + (".position_ids",), label="BERT", params_text=runnable_params,
                    training_only=_TRAINING_ONLY)
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
