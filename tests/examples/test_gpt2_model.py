"""gpt2 model: attention, loss and metrics against hand computations; bad model keys are params errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from gpt2_helpers import random_samples, tiny_params, write_vendor_shards

from cs_run.errors import ParamsError
from cs_run.metrics import Metric
from cs_run.models.common import decoder, lm
from cs_run.models.gptj import model as gptj_model
from cs_run.params import load_params
from cs_run.resolve import resolve_params
from cs_run.runners import PyTorchBaseRunner

SIZES = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_heads=4, filter_size=32,
             max_position_embeddings=12, dropout_rate=0.0, attention_type="scaled_dot_product")


def make(**overrides) -> lm.DecoderLMModel:
    torch.manual_seed(0)
    return lm.build_model(**{**SIZES, **overrides})


def batch(b=3, s=10, vocab=50, seed=0, masked_tail=3):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, s, dtype=torch.int32)
    mask[0, s - masked_tail:] = 0
    return {"input_ids": torch.randint(0, vocab, (b, s), generator=g, dtype=torch.int32),
            "labels": torch.randint(0, vocab, (b, s), generator=g, dtype=torch.int32), "attention_mask": mask}


def reference_forward(m: decoder.DecoderLM, ids: torch.Tensor, scaled: bool, act=F.gelu) -> torch.Tensor:
    """The decoder written out by hand: explicit softmax(QK^T * scale + causal mask) V per head."""
    e = m.embedding_layer
    x = e.word_embeddings.weight[ids.long()] + e.position_embeddings.embed.weight[: ids.shape[1]]
    s, nh = ids.shape[1], SIZES["num_heads"]
    causal = torch.full((s, s), float("-inf")).triu(1)
    for layer in m.transformer_decoder.layers:
        a = layer.self_attn
        h = layer.norm1(x)
        q, k, v = (lin(h).view(*h.shape[:2], nh, -1).transpose(1, 2)
                   for lin in (a.proj_q_dense_layer, a.proj_k_dense_layer, a.proj_v_dense_layer))
        scale = 1 / math.sqrt(q.shape[-1]) if scaled else 1.0
        w = torch.softmax(q @ k.transpose(-1, -2) * scale + causal, dim=-1)
        x = x + a.proj_output_dense_layer((w @ v).transpose(1, 2).reshape(h.shape))
        f = layer.ffn.ffn
        x = x + f[1].linear_layer(act(f[0].linear_layer(layer.norm3(x))))
    return m.ln_f(x) @ e.word_embeddings.weight.T


@pytest.mark.parametrize("attention_type", ["scaled_dot_product", "dot_product"])
def test_logits_match_a_hand_written_decoder(attention_type):
    m = make(attention_type=attention_type).eval()
    ids = batch()["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(m.model(ids), reference_forward(m.model, ids, attention_type == "scaled_dot_product"),
                                   rtol=1e-5, atol=1e-5)


def test_tied_head_and_model_zoo_key_names():
    m = make()
    assert m.model.lm_head.weight is m.model.embedding_layer.word_embeddings.weight
    keys = set(m.state_dict())
    assert {"model.embedding_layer.word_embeddings.weight", "model.embedding_layer.position_embeddings.embed.weight",
            "model.transformer_decoder.layers.1.self_attn.proj_q_dense_layer.weight",
            "model.transformer_decoder.layers.0.ffn.ffn.1.linear_layer.bias", "model.ln_f.weight",
            "model.transformer_decoder.norm.weight", "model.lm_head.weight"} <= keys
    untied = make(share_embedding_weights=False, use_bias_in_output=True)
    assert untied.model.lm_head.weight is not untied.model.embedding_layer.word_embeddings.weight
    assert untied.model.lm_head.bias is not None


def test_fixed_position_embeddings_are_sinusoids_and_not_trained():
    m = make(position_embedding_type="fixed")
    table = m.model.embedding_layer.position_embeddings.fpe
    assert not any(p is table for p in m.parameters())
    pos, i = 5, 3
    n = SIZES["hidden_size"] // 2
    inv = math.exp(-i * math.log(1.0e4) / (n - 1))
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos * inv), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos * inv), abs=1e-6)
    none = make(use_position_embedding=False)
    assert none.model.embedding_layer.position_embeddings is None


@pytest.mark.parametrize("scaling,weight", [("num_tokens", 1.0), ("batch_size", 1 / 8), ("BATCH_SIZE", 0.5)])
def test_loss_follows_model_zoo_scaling_and_mask(scaling, weight):
    m = make(loss_scaling=scaling, loss_weight=weight).eval()
    b = batch()
    with torch.no_grad():
        logits = m.model(b["input_ids"])
        per_token = F.cross_entropy(logits.reshape(-1, 50), b["labels"].reshape(-1).long(), reduction="none")
        mask = b["attention_mask"].reshape(-1).float()
        summed = (per_token * mask).sum()
        expected = summed / mask.sum() if scaling == "num_tokens" else summed / 3 * weight
        torch.testing.assert_close(m(b), expected)
        changed = dict(b, labels=b["labels"].clone())
        changed["labels"][0, -1] = (changed["labels"][0, -1] + 1) % 50  # a masked position
        torch.testing.assert_close(m(changed), expected)


def test_loss_weight_is_ignored_with_num_tokens_as_in_the_model_zoo(caplog):
    m = make(loss_weight=0.25)
    assert m.loss_weight == 1.0 and "has no effect" in caplog.text


@pytest.mark.parametrize("scaling", ["num_tokens", "batch_size"])
def test_eval_metrics_are_mask_weighted_accuracy_and_perplexity(scaling):
    m = make(loss_scaling=scaling, loss_weight=0.1 if scaling == "batch_size" else 1.0).eval()
    total, tokens, correct = 0.0, 0.0, 0.0
    with torch.no_grad():
        for seed in (0, 1):
            b = batch(seed=seed)
            m(b)
            logits = m.model(b["input_ids"])
            mask = b["attention_mask"].float()
            per_token = F.cross_entropy(logits.reshape(-1, 50), b["labels"].reshape(-1).long(), reduction="none")
            total += float((per_token * mask.reshape(-1)).sum())
            tokens += float(mask.sum())
            correct += float(((logits.argmax(-1) == b["labels"]).float() * mask).sum())
    results = {metric.name: float(metric) for metric in m.modules() if isinstance(metric, Metric)}  # this model's
    assert results["eval/lm_perplexity"] == pytest.approx(math.exp(total / tokens), rel=1e-5)
    assert results["eval/accuracy"] == pytest.approx(correct / tokens, rel=1e-6)


def test_dropout_is_on_in_training_only():
    m = make(dropout_rate=0.5)
    b = batch()
    torch.manual_seed(1)
    assert m(b).item() != m(b).item()
    m.eval()
    assert m(b).item() == m(b).item()


@pytest.mark.parametrize("key,value", [
    ("position_embedding_type", "relative"), ("attention_type", "flash"), ("nonlinearity", "swish_glu"),
    ("norm_type", "batchnorm1d"), ("attention_chunk_size", 4), ("rel_distance_mode", "capped"),
    ("fixed_sparse_attention", {"num_heads": 4}), ("moe", {"num_experts": 4, "routing_algorithm": "hash"}),
    ("extra_attention_params", {"num_kv_groups": 2}), ("pos_scaling_type", "ntk"),
    ("loss_scaling", "per_sample"), ("hidden_size", 18), ("num_heads", 0),
    ("dropout_rate", 1.0), ("attention_dropout_rate", -0.1), ("loss_weight", 0.0), ("vocab_size", 0),
])
def test_unsupported_values_are_params_errors_naming_the_key(tmp_path, key, value):
    write_vendor_shards(tmp_path / "d", random_samples(8, 16, 64), 8)
    model = {key: value, "loss_scaling": "batch_size"} if key == "loss_weight" else {key: value}
    path = tiny_params(tmp_path / "p.yaml", tmp_path / "d", tmp_path / "d", model=model)
    with pytest.raises(ParamsError, match=f"model(: |\\.){key}"):
        params = load_params(path)
        PyTorchBaseRunner.create(params, device="CPU")


@pytest.mark.parametrize("key", ["rotary_dims", "attention_modul", "fixed_sparse_attn", "hidden_sise"])
def test_unknown_model_keys_are_params_errors_at_load(tmp_path, key):
    path = tiny_params(tmp_path / "p.yaml", tmp_path, tmp_path, model={key: 1})
    with pytest.raises(ParamsError, match=f"model.{key}"):
        resolve_params(load_params(path))


def test_a_model_zoo_file_without_model_name_is_gpt2_by_its_data_processor(tmp_path):
    import yaml

    path = tiny_params(tmp_path / "p.yaml", tmp_path, tmp_path, model={"mixed_precision": True})
    raw = yaml.safe_load(path.read_text())
    del raw["model"]["name"]
    path.write_text(yaml.safe_dump(raw))
    params = load_params(path)
    assert params.model.name == "gpt2" and params.model.use_bfloat16  # the Model Zoo GPT-2 default
    raw["model"]["use_bfloat16"] = False
    raw["train_input"]["data_processor"] = raw["eval_input"]["data_processor"] = "SomeOtherProcessor"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamsError, match="missing required key model.name"):
        resolve_params(load_params(path))


def test_a_data_processor_gpt2_does_not_read_is_a_params_error(tmp_path):
    path = tiny_params(tmp_path / "p.yaml", tmp_path, tmp_path)
    path.write_text(path.read_text().replace("GptHDF5DataProcessor", "GptTextDataProcessor", 1))
    with pytest.raises(ParamsError, match=r"(train|eval)_input.data_processor: 'GptTextDataProcessor' is not one gpt2's "
                                          r"data reads.*p.yaml:\d+"):
        load_params(path)


def test_release_1_9s_use_rms_norm_is_norm_type_rmsnorm():
    """Release 1.9's gpt2 model: ``norm_class = RMSNorm if use_rms_norm else nn.LayerNorm`` (its llama files
    set use_rms_norm: True); the same weights and logits as norm_type: rmsnorm."""
    ids = batch()["input_ids"]
    legacy, modern = make(use_rms_norm=True), make(norm_type="rmsnorm")
    assert type(legacy.model.ln_f) is type(modern.model.ln_f) is not type(make().model.ln_f)
    torch.testing.assert_close(legacy.model(ids), modern.model(ids), rtol=0, atol=0)
    with pytest.raises(ValueError, match="use_rms_norm: true and norm_type: biasless-layernorm name two norms"):
        make(use_rms_norm=True, norm_type="biasless-layernorm")


@pytest.mark.parametrize("key, value, base", [
    ("precision_opt_level", 1, {}), ("allow_multireplica", False, {}), ("tf_summary", False, {}),
    ("scale_by_layer_index", False, {}), ("scale_by_layer_index", True, {}),  # Release 2.1's santacoder file
    ("alibi_implementation", "expand", {"position_embedding_type": "alibi"}),
    ("alibi_implementation", "embedding", {"position_embedding_type": "alibi"}),
])
def test_release_1_x_cerebras_only_model_keys_change_nothing(key, value, base):
    """Keys of Releases 1.7-2.0 files that steer only the Cerebras compiler (or nothing): the same model."""
    ids = batch()["input_ids"]
    torch.testing.assert_close(make(**base, **{key: value}).model(ids), make(**base).model(ids), rtol=0, atol=0)


def test_the_gptj_familys_release_1_x_files_precision_opt_level_changes_nothing():
    """R_1.7-1.9's gpt-neox, gptj and falcon files set model.precision_opt_level (gptj's own schema)."""
    ids = batch()["input_ids"]
    sizes = {k: v for k, v in SIZES.items() if k != "attention_type"}
    torch.manual_seed(0)
    with_key = gptj_model.build_model(**sizes, rotary_dim=4, precision_opt_level=1)
    torch.manual_seed(0)
    without = gptj_model.build_model(**sizes, rotary_dim=4)
    torch.testing.assert_close(with_key.eval().model(ids), without.eval().model(ids), rtol=0, atol=0)  # no dropout
