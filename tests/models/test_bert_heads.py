"""bert/classifier and bert/token_classifier (the Model Zoo 2.10 BertForSequenceClassificationModel and
BertForTokenClassificationModel) against transformers' BertForSequenceClassification / BertForTokenClassification
with the same weights. The classifier: logits within 1e-5 and the vendor's loss (its
BertForSequenceClassificationLoss: mean cross entropy, or MSE for one label) within 1e-5 of transformers' loss;
the tensors' way back to HF is bit for bit; bad model keys are one error naming the key. The four Release 2.10
classifier files (bert_base/large_classifier_sst2/mnli), shrunk by tools/modelzoo_files.py (sizes, batch, steps
and data paths only), read GLUE data, their first loss is transformers' on the same batch with the same weights
(dropout off), and they pass validate-only and train 5 steps on CPU and on CSX (fx). The token classifier:
logits within 1e-5 of transformers and the vendor's loss (BertForTokenClassificationLoss: masked token cross
entropy summed / batch * loss_weight, / length with include_padding_in_loss) by hand from transformers' logits,
both ways through checkpoint convert, and bert_base_ner_bc5cdr_chem.yaml likewise. Extractive summarization
(BertSummarizationModel; no Hugging Face class): its loss by hand from transformers' BertModel hidden states
with the same encoder weights, gathered at the [CLS] positions, through the classifier's weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from hf_helpers import build as build_keys
from hf_helpers import to_hf_is_refused
from modelzoo_file_helpers import mz, needs_mirror, run_file, shrunk

from cs_run.checkpoint import load
from cs_run.data.processors.bert_classifier import build_dataloader
from cs_run.data.processors.bert_summarization import build_dataloader as bertsum_data
from cs_run.data.processors.bert_token_classifier import build_dataloader as ner_data
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli
from cs_run.models.bert_classifier.hf import from_hf_state_dict, head_names, hf_config, model_keys_from_hf_config, to_hf_state_dict
from cs_run.models.bert_classifier.model import BertClassifierConfig, build
from cs_run.models.bert_token_classifier.hf import hf_config as token_hf_config
from cs_run.models.bert_token_classifier.hf import model_keys_from_hf_config as token_keys
from cs_run.summaries import read_scalars
from tests.modelzoo_marks import first_in_suite_rest_in_sweep

transformers = pytest.importorskip("transformers")

V, MSL, B = 61, 10, 4
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, vocab_size=V,
             max_position_embeddings=16, type_vocab_size=2)


def _batch(num_labels: int) -> dict:
    """Sequences of 10, 8, 6 and 3 tokens (the rest padding 0), a second segment, labels of the task."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, V, (B, MSL), generator=g)
    mask = torch.ones(B, MSL, dtype=torch.int32)
    for row, length in enumerate((10, 8, 6, 3)):
        ids[row, length:], mask[row, length:] = 0, 0
    segments = (torch.arange(MSL) >= 4).int().expand(B, -1) * mask
    labels = torch.randn(B, generator=g) if num_labels == 1 else \
        torch.randint(0, num_labels, (B,), generator=g, dtype=torch.int32)
    return {"input_ids": ids.int(), "attention_mask": mask, "token_type_ids": segments, "labels": labels}


def _pair(num_labels: int):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(**SIZES, num_labels=num_labels, hidden_act="gelu", layer_norm_eps=1e-5)
    hf = transformers.BertForSequenceClassification(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a swapped name shows
        for name, p in hf.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    keys = model_keys_from_hf_config(cfg.to_dict())
    keys.pop("name")
    ours = build(BertClassifierConfig(**keys)).eval()
    from_hf_state_dict(ours, hf.state_dict())
    return hf, ours


@pytest.mark.parametrize("num_labels", [2, 3, 1], ids=["sst2", "mnli", "regression"])
def test_logits_and_loss_match_transformers(num_labels):
    hf, ours = _pair(num_labels)
    batch = _batch(num_labels)
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"].long(), attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"].long(),
                    labels=batch["labels"] if num_labels == 1 else batch["labels"].long())
        logits = ours.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        loss = ours(batch)
    torch.testing.assert_close(logits, theirs.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(loss, theirs.loss, rtol=0, atol=1e-5)


def test_way_back_to_hf_is_bit_identical():
    hf, ours = _pair(3)
    back = to_hf_state_dict(ours)
    expected = {k: v for k, v in hf.state_dict().items() if not k.endswith("position_ids")}
    assert back.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(back[name], value), name
    cfg = hf_config(ours.config)
    assert (cfg["num_labels"], cfg["type_vocab_size"], cfg["architectures"]) == \
        (3, 2, ["BertForSequenceClassification"])


def test_vendor_module_names_and_classifier_init():
    """The vendor's checkpoint keys (model.bert..., model.classifier) and its N(0, 0.02) classifier, bias 0."""
    torch.manual_seed(0)
    m = build(BertClassifierConfig(hidden_size=256, num_hidden_layers=1, num_heads=4, filter_size=64,
                                   max_position_embeddings=8, num_labels=3, pooler_nonlinearity="tanh"))
    names = set(m.state_dict())
    assert {"model.classifier.weight", "model.classifier.bias",
            "model.bert.pooler.pooler.ffn.0.linear_layer.weight",
            "model.bert.embedding_layer.segment_embeddings.weight"} <= names
    w = m.model.classifier.weight
    assert abs(w.std().item() - 0.02) < 0.002 and w.abs().max().item() > 0.04  # normal, not truncated at 2 std
    assert torch.count_nonzero(m.model.classifier.bias) == 0
    assert m.config["vocab_size"] == 30522 and m.config["embedding_dropout_rate"] == m.config["dropout_rate"]


def _convert(*args) -> None:
    result = CliRunner().invoke(checkpoint_cli, ["convert", *map(str, args)])
    assert result.exit_code == 0, result.output


def test_checkpoint_convert_both_ways(tmp_path):
    """``--from hf`` on a BertForSequenceClassification folder (model_type bert) gives bert/classifier with
    transformers' logits; ``--to hf`` writes its tensors back bit for bit and a config transformers reads."""
    st = pytest.importorskip("safetensors.torch")
    hf, _ = _pair(3)
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    _convert("--from", "hf", tmp_path / "hf", tmp_path / "model.mdl")
    params = yaml.safe_load((tmp_path / "model.yaml").read_text())
    assert params["model"]["name"] == "bert/classifier"
    assert params["train_input"]["data_processor"] == "MNLIDataProcessor"
    model = build_keys(params["model"])
    model.load_state_dict(load(str(tmp_path / "model.mdl"))["model"])
    batch = _batch(3)
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"].long(), attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"].long()).logits
        ours = model.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"model": params["model"]}))
    _convert("--to", "hf", "--params", tmp_path / "run.yaml", tmp_path / "model.mdl", tmp_path / "back")
    written = st.load_file(str(tmp_path / "hf" / "model.safetensors"))
    back = st.load_file(str(tmp_path / "back" / "model.safetensors"))
    assert back.keys() == {k for k in written if not k.endswith("position_ids")}
    assert all(torch.equal(back[k], written[k]) for k in back)
    again = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert torch.equal(again(input_ids=batch["input_ids"].long(), attention_mask=batch["attention_mask"],
                                 token_type_ids=batch["token_type_ids"].long()).logits, theirs)


def test_to_hf_refuses_a_pooler_hf_cannot_express(tmp_path):
    keys = dict(name="bert/classifier", hidden_size=32, num_hidden_layers=1, num_heads=4, filter_size=64,
                max_position_embeddings=8, pooler_nonlinearity="relu")
    assert "model.pooler_nonlinearity: 'relu'" in to_hf_is_refused(tmp_path, keys)


BAD_KEYS = [
    ({"problem_type": "multi_label_classification"}, "problem_type"),
    ({"num_labels": 1}, "num_labels"),
    ({"problem_type": "regression", "num_labels": 2}, "num_labels"),
    ({"task_dropout": 1.0}, "task_dropout"),
    ({"disable_nsp": True}, "disable_nsp"),
    ({"add_pooling_layer": False}, "add_pooling_layer"),
    ({"hidden_size": 30}, "hidden_size"),
]


@pytest.mark.parametrize("keys,named", BAD_KEYS, ids=[k for _, k in BAD_KEYS])
def test_bad_model_keys_are_one_error_naming_the_key(keys, named):
    base = dict(hidden_size=32, num_hidden_layers=1, num_heads=4, filter_size=64, max_position_embeddings=8)
    with pytest.raises(ValueError, match=f"^{named}:"):
        build(BertClassifierConfig(**{**base, **keys}))


HEAD_FILES = ["classifier/configs/bert_base_classifier_sst2", "classifier/configs/bert_base_classifier_mnli",
                    "classifier/configs/bert_large_classifier_sst2", "classifier/configs/bert_large_classifier_mnli",
                    "token_classifier/configs/bert_base_ner_bc5cdr_chem",
                    "extractive_summarization/configs/bert_base_summarization",
                    "extractive_summarization/configs/bert_large_summarization"]


def _path(name: str) -> str:
    return f"src/cerebras/modelzoo/models/nlp/bert/{name}.yaml"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bert_glue")
    mz.write_bert_csv(out)
    return out


@needs_mirror
@pytest.mark.parametrize("name, labels", [("classifier/configs/bert_base_classifier_sst2", 2),
                                          ("classifier/configs/bert_large_classifier_mnli", 3)])
def test_files_first_loss_is_transformers_loss(tmp_path, data, name, labels):
    trainer = shrunk(_path(name), data, tmp_path)["trainer"]
    keys = dict(trainer["init"]["model"])
    assert (keys["name"], keys["num_labels"]) == ("bert/classifier", labels)
    torch.manual_seed(1)
    model = build_keys(keys)  # eval mode: dropout off for the comparison
    section = {k: v for k, v in trainer["fit"]["train_dataloader"].items() if k != "num_workers"}
    batch = next(iter(build_dataloader("train", **section)))
    assert batch["input_ids"].shape == (mz.BATCH_SIZE, mz.MODEL_SIZES["max_position_embeddings"])
    with torch.no_grad():
        ours = model(dict(batch))
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(**hf_config(model.config))).eval()
    hf.load_state_dict(to_hf_state_dict(model), strict=False)
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"].long(), attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"].long(), labels=batch["labels"].long())
    torch.testing.assert_close(ours, theirs.loss, rtol=0, atol=1e-5)


@needs_mirror
@pytest.mark.slow
@pytest.mark.parametrize("name", first_in_suite_rest_in_sweep(HEAD_FILES, keep=HEAD_FILES[4:6]))
def test_head_files_validate_and_train_five_steps_on_cpu_and_csx(tmp_path, data, name):
    """Each file passes validate-only and trains 5 steps on CPU and on CSX (fx), with the same losses where its
    training data is seeded (bert_base_ner_bc5cdr_chem shuffles without a shuffle_seed, so its batches differ)."""
    def run(command: str, device: str, out: str) -> dict:
        return run_file(_path(name), data, tmp_path / out, command, device)

    results = [run("validate-only", "CPU", "v"), run("train", "CPU", "cpu"), run("train", "CSX", "csx")]
    assert all(r["first_error"] == "ok" for r in results), (name, results)
    cpu, csx = (read_scalars(Path(r["params"]).parent / "model_dir" / "train")["loss"] for r in results[1:])
    assert cpu and cpu[-1][0] == 5 and csx[-1][0] == 5, (name, cpu, csx)
    train = yaml.safe_load(Path(results[1]["params"]).read_text())["trainer"]["fit"]["train_dataloader"]
    if not train.get("shuffle", True) or train.get("shuffle_seed") is not None:  # the NER file draws unseeded
        assert cpu == csx, (name, cpu, csx)


def _token_pair(**keys):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(**SIZES, num_labels=7, hidden_act="gelu", layer_norm_eps=1e-5)
    hf = transformers.BertForTokenClassification(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model_keys = {**token_keys(cfg.to_dict()), **keys}
    ours = build_keys(model_keys)
    from_hf_state_dict(ours, hf.state_dict())
    return hf, ours


def _token_batch() -> dict:
    batch = _batch(2)
    g = torch.Generator().manual_seed(4)
    batch["labels"] = torch.randint(0, 7, (B, MSL), generator=g, dtype=torch.int32) * batch["attention_mask"]
    return batch


@pytest.mark.parametrize("include_padding_in_loss, loss_weight", [(False, 1.0), (True, 1.0), (False, 0.5)])
def test_token_classifier_logits_and_vendor_loss(include_padding_in_loss, loss_weight):
    hf, ours = _token_pair(include_padding_in_loss=include_padding_in_loss, loss_weight=loss_weight)
    batch = _token_batch()
    mask = torch.ones_like(batch["attention_mask"]) if include_padding_in_loss else batch["attention_mask"]
    batch["loss_mask"] = mask
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"].long(), attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"].long()).logits
        logits = ours.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        loss = ours(batch)
    torch.testing.assert_close(logits, theirs, rtol=0, atol=1e-5)
    ce = torch.nn.functional.cross_entropy(theirs.reshape(-1, 7), batch["labels"].reshape(-1).long(), reduction="none")
    expected = (ce * mask.reshape(-1)).sum() / B * loss_weight / (MSL if include_padding_in_loss else 1)
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-5)


def test_token_classifier_checkpoint_convert_both_ways(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    hf, _ = _token_pair()
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    _convert("--from", "hf", tmp_path / "hf", tmp_path / "model.mdl")
    params = yaml.safe_load((tmp_path / "model.yaml").read_text())
    assert params["model"]["name"] == "bert/token_classifier" and params["model"]["num_classes"] == 7
    model = build_keys(params["model"])
    model.load_state_dict(load(str(tmp_path / "model.mdl"))["model"])
    batch = _token_batch()
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"].long(), attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"].long()).logits
        ours = model.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    keys = {**params["model"], "include_padding_in_loss": True}  # a loss key: no part of the HF config
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"model": keys}))
    _convert("--to", "hf", "--params", tmp_path / "run.yaml", tmp_path / "model.mdl", tmp_path / "back")
    written = st.load_file(str(tmp_path / "hf" / "model.safetensors"))
    back = st.load_file(str(tmp_path / "back" / "model.safetensors"))
    assert back.keys() == {k for k in written if not k.endswith("position_ids")}
    assert all(torch.equal(back[k], written[k]) for k in back)
    assert token_hf_config(model.config)["architectures"] == ["BertForTokenClassification"]


@needs_mirror
def test_ner_file_first_loss_is_the_vendor_loss_of_transformers_logits(tmp_path, data):
    name = "token_classifier/configs/bert_base_ner_bc5cdr_chem"
    trainer = shrunk(_path(name), data, tmp_path)["trainer"]
    keys = dict(trainer["init"]["model"])
    assert keys["include_padding_in_loss"] is True and keys["num_classes"] == 7
    torch.manual_seed(1)
    model = build_keys(keys)
    section = {k: v for k, v in trainer["fit"]["train_dataloader"].items() if k != "num_workers"}
    batch = next(iter(ner_data("train", **section, label_vocab_file=keys["label_vocab_file"],
                               include_padding_in_loss=True)))
    assert bool((batch["loss_mask"] == 1).all()) and not bool((batch["attention_mask"] == 1).all())
    with torch.no_grad():
        ours = model(dict(batch))
    hf = transformers.BertForTokenClassification(transformers.BertConfig(**token_hf_config(model.config))).eval()
    hf.load_state_dict(to_hf_state_dict(model), strict=False)
    with torch.no_grad():
        logits = hf(input_ids=batch["input_ids"].long(), attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"].long()).logits
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 7), batch["labels"].reshape(-1).long(), reduction="none")
    b, length = batch["input_ids"].shape
    torch.testing.assert_close(ours, ce.sum() / b / length, rtol=0, atol=1e-5)


TOKEN_BAD_KEYS = [
    ({"num_classes": None}, "num_classes"),
    ({"encoder_output_dropout_rate": None}, "encoder_output_dropout_rate"),
    ({"add_pooling_layer": True}, "add_pooling_layer"),
    ({"compute_eval_metrics": True}, "label_vocab_file"),
    ({"label_smoothing": 0.1}, "label_smoothing"),
    ({"encoder_output_dropout_rate": 1.5}, "encoder_output_dropout_rate"),
]


@pytest.mark.parametrize("keys,named", TOKEN_BAD_KEYS, ids=[f"{k}{i}" for i, (_, k) in enumerate(TOKEN_BAD_KEYS)])
def test_token_classifier_bad_keys_are_one_error_naming_the_key(keys, named):
    base = dict(name="bert/token_classifier", hidden_size=32, num_hidden_layers=1, num_heads=4, filter_size=64,
                max_position_embeddings=8, num_classes=7, encoder_output_dropout_rate=0.1)
    with pytest.raises(ValueError, match=f"^{named}:"):
        build_keys({**base, **keys})


def _summarization_loss_by_hand(model, batch) -> torch.Tensor:
    """transformers' BertModel (no pooler) with the model's encoder weights, hidden states at cls_indices, the
    classifier's weights, cross entropy times cls_weights summed / batch * loss_weight."""
    c = model.config
    cfg = transformers.BertConfig(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                                  num_hidden_layers=c["num_hidden_layers"], num_attention_heads=c["num_heads"],
                                  intermediate_size=c["filter_size"], hidden_act=c["nonlinearity"],
                                  layer_norm_eps=c["layer_norm_epsilon"], pad_token_id=c["embedding_pad_token_id"],
                                  max_position_embeddings=c["max_position_embeddings"],
                                  type_vocab_size=c["num_segments"])
    hf = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    sd = model.state_dict()
    weights = {hf_name[len("bert."):]: sd[ours] for hf_name, ours in head_names(c["num_hidden_layers"], False)
               if hf_name.startswith("bert.")}
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    assert not unexpected and all(k.endswith("position_ids") for k in missing)
    with torch.no_grad():
        hidden = hf(input_ids=batch["input_ids"].long(), attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"].long()).last_hidden_state
    index = batch["cls_indices"].long()[..., None].expand(-1, -1, hidden.shape[-1])
    logits = torch.gather(hidden, 1, index) @ sd["model.classifier.weight"].T
    if "model.classifier.bias" in sd:
        logits = logits + sd["model.classifier.bias"]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, c["num_labels"]), batch["labels"].reshape(-1).long(),
                                           reduction="none")
    return (ce * batch["cls_weights"].reshape(-1)).sum() / batch["labels"].shape[0] * c["loss_weight"]


@pytest.mark.parametrize("use_cls_bias, loss_weight", [(True, 0.0539), (False, None)])
def test_summarization_loss_by_hand(use_cls_bias, loss_weight):
    torch.manual_seed(0)
    model = build_keys(dict(name="bert/extractive_summarization", vocab_size=V, hidden_size=32, num_hidden_layers=2,
                            num_heads=4, filter_size=48, max_position_embeddings=16, use_cls_bias=use_cls_bias,
                            loss_weight=loss_weight))
    with torch.no_grad():  # non-trivial biases, so a dropped one shows
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    batch = _batch(2)
    batch["cls_indices"] = torch.tensor([[0, 4, 7], [0, 5, 0], [0, 2, 0], [0, 0, 0]], dtype=torch.int32)
    batch["cls_weights"] = (batch["cls_indices"] != 0).float()
    batch["labels"] = torch.tensor([[0, 1, 0], [1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.int32)
    with torch.no_grad():
        ours = model(batch)
    assert model.config["loss_weight"] == (loss_weight or 1.0)
    torch.testing.assert_close(ours, _summarization_loss_by_hand(model, batch), rtol=0, atol=1e-5)
    assert ("model.classifier.bias" in model.state_dict()) == use_cls_bias


@needs_mirror
def test_summarization_file_first_loss_by_hand(tmp_path, data):
    name = "extractive_summarization/configs/bert_base_summarization"
    trainer = shrunk(_path(name), data, tmp_path)["trainer"]
    keys = dict(trainer["init"]["model"])
    assert keys["loss_weight"] == 0.0539
    torch.manual_seed(1)
    model = build_keys(keys)
    section = {k: v for k, v in trainer["fit"]["train_dataloader"].items() if k != "num_workers"}
    batch = next(iter(bertsum_data("train", **section, vocab_file=keys["vocab_file"])))
    assert batch["cls_indices"].shape == (mz.BATCH_SIZE, mz.MAX_CLS_TOKENS)
    with torch.no_grad():
        ours = model(dict(batch))
    torch.testing.assert_close(ours, _summarization_loss_by_hand(model, batch), rtol=0, atol=1e-5)


SUM_BAD_KEYS = [
    ({"num_labels": 3}, "num_labels"),
    ({"add_pooling_layer": True}, "add_pooling_layer"),
    ({"compute_eval_metrics": True}, "compute_eval_metrics"),
    ({"disable_nsp": True}, "disable_nsp"),
]


@pytest.mark.parametrize("keys,named", SUM_BAD_KEYS, ids=[k for _, k in SUM_BAD_KEYS])
def test_summarization_bad_keys_are_one_error_naming_the_key(keys, named):
    base = dict(name="bert/extractive_summarization", hidden_size=32, num_hidden_layers=1, num_heads=4,
                filter_size=64, max_position_embeddings=8)
    with pytest.raises(ValueError, match=f"^{named}:"):
        build_keys({**base, **keys})


def test_classifier_eval_metrics_by_hand():
    """eval/accuracy over all samples, eval/accuracy_matched / _mismatched over the is_matched / is_mismatched
    ones (MNLI's dev files), from the logits' argmax."""
    hf, _ = _pair(3)
    keys = model_keys_from_hf_config(hf.config.to_dict())
    model = build_keys({**keys, "compute_eval_metrics": True})
    from_hf_state_dict(model, hf.state_dict())
    batch = _batch(3)
    batch["is_matched"] = torch.tensor([1, 1, 0, 0], dtype=torch.int32)
    batch["is_mismatched"] = 1 - batch["is_matched"]
    with torch.no_grad():
        model(batch)
        predictions = model.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).argmax(-1)
    right = (predictions == batch["labels"].long()).float()
    assert model.f1_metric is None  # micro F1 only for two labels, as the vendor
    assert float(model.accuracy_metric.compute()) == pytest.approx(right.mean().item())
    assert float(model.matched_accuracy_metric.compute()) == pytest.approx(right[:2].mean().item())
    assert float(model.mismatched_accuracy_metric.compute()) == pytest.approx(right[2:].mean().item())


def test_token_classifier_f1_scores_only_b_and_i_labels(tmp_path):
    """eval/f1_score: macro F1 over label2id.json's B* and I* labels (ids 1 and 2 here), by hand."""
    labels = {"[PAD]": 0, "B": 1, "I": 2, "O": 3, "X": 4, "[CLS]": 5, "[SEP]": 6}
    (tmp_path / "label2id.json").write_text(json.dumps(labels))
    _, model = _token_pair(compute_eval_metrics=True, label_vocab_file=str(tmp_path / "label2id.json"))
    batch = _token_batch()
    batch["loss_mask"] = batch["attention_mask"]
    with torch.no_grad():
        model(batch)
        predictions = model.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).argmax(-1)
    truth, guess = batch["labels"].reshape(-1).long(), predictions.reshape(-1)
    scores = []
    for k in (1, 2):
        tp = ((guess == k) & (truth == k)).sum().item()
        fp = ((guess == k) & (truth != k)).sum().item()
        fn = ((guess != k) & (truth == k)).sum().item()
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    assert float(model.f1_metric.compute()) == pytest.approx(sum(scores) / 2)
