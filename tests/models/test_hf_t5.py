"""t5 <-> Hugging Face T5ForConditionalGeneration: a tiny random HF model converted with ``checkpoint convert
--from hf`` computes transformers' logits within 1e-5 and its loss within 1e-5 (mlm_loss_scaling num_masked is
HF's mean over the target tokens; batch_size by hand from the same logits); ``--to hf`` writes the folder's
tensors back bit for bit; a model HF cannot express is refused naming the key."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner
from hf_helpers import TOL, build, tiny_hf

from cs_run.checkpoint import load, save
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")

V, B, S, T = 61, 3, 11, 7  # vocab, batch, source and target lengths
SIZES = dict(vocab_size=V, d_model=32, d_kv=6, d_ff=40, num_layers=2, num_decoder_layers=3, num_heads=4,
             relative_attention_num_buckets=8, layer_norm_epsilon=1e-6, decoder_start_token_id=0, pad_token_id=0)


def _batch() -> dict:
    """Sources of 11, 8 and 5 tokens (padded with 0), targets of 7, 6 and 4; decoder inputs are the labels
    shifted right behind the start token 0, as the vendor's data writes them."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, V, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.int32)
    labels = torch.randint(2, V, (B, T), generator=g)
    dmask = torch.ones(B, T, dtype=torch.int32)
    for row, (n, m) in enumerate(((11, 7), (8, 6), (5, 4))):
        ids[row, n:], mask[row, n:] = 0, 0
        labels[row, m:], dmask[row, m:] = 0, 0
    dec = torch.cat([torch.zeros(B, 1, dtype=labels.dtype), labels[:, :-1]], dim=1)
    return {"input_ids": ids.int(), "attention_mask": mask, "decoder_input_ids": dec.int(),
            "decoder_attention_mask": dmask, "labels": labels.int()}


def _convert(*args) -> None:
    result = CliRunner().invoke(checkpoint_cli, ["convert", *map(str, args)])
    assert result.exit_code == 0, result.output


def _ours(tmp_path, **extra):
    _convert("--from", "hf", tmp_path / "hf", tmp_path / "model.mdl")
    keys = yaml.safe_load((tmp_path / "model.yaml").read_text())["model"]
    assert keys["name"] == "t5"
    model = build({**keys, **extra})
    model.load_state_dict(load(str(tmp_path / "model.mdl"))["model"])
    return keys, model


def _hf(batch, hf):
    labels = batch["labels"].long().masked_fill(batch["decoder_attention_mask"] == 0, -100)
    with torch.no_grad():
        return hf(input_ids=batch["input_ids"].long(), attention_mask=batch["attention_mask"],
                  decoder_input_ids=batch["decoder_input_ids"].long(), labels=labels)


@pytest.mark.parametrize("tied, act", [(True, "relu"), (False, "gelu")])
def test_t5_from_hf_matches_transformers_and_back_is_exact(tmp_path, tied, act):
    hf = tiny_hf("T5Config", "T5ForConditionalGeneration", tie_word_embeddings=tied, feed_forward_proj=act, **SIZES)
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    batch = _batch()
    out = _hf(batch, hf)
    keys, model = _ours(tmp_path, mlm_loss_scaling="num_masked")
    assert keys["share_embedding_weights"] is tied and keys["encoder_nonlinearity"] == act
    with torch.no_grad():
        logits = model.model(batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"])
        loss = model(dict(batch))
    torch.testing.assert_close(logits, out.logits, **TOL)
    assert loss.item() == pytest.approx(out.loss.item(), rel=1e-5, abs=1e-6)
    # batch_size scaling by hand from transformers' logits: masked sum / batch * lm_loss_weight
    model = build({**keys, "lm_loss_weight": 0.25})
    model.load_state_dict(load(str(tmp_path / "model.mdl"))["model"])
    ce = F.cross_entropy(out.logits.reshape(-1, V), batch["labels"].reshape(-1).long(), reduction="none")
    expected = (ce * batch["decoder_attention_mask"].reshape(-1)).sum() / B * 0.25
    with torch.no_grad():
        assert model(dict(batch)).item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    _convert("--to", "hf", tmp_path / "model.mdl", tmp_path / "back", "--params", tmp_path / "model.yaml")
    theirs = st.load_file(str(tmp_path / "hf" / "model.safetensors"))
    ours = st.load_file(str(tmp_path / "back" / "model.safetensors"))
    assert ours.keys() <= theirs.keys() and "encoder.block.1.layer.1.DenseReluDense.wo.weight" in ours
    for key, value in ours.items():
        assert torch.equal(theirs[key], value), key
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == "t5"
    again = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "back")).eval()
    torch.testing.assert_close(_hf(batch, again).logits, out.logits, **TOL)


REFUSED = [  # (model key, value): each has no HF T5 equivalent
    ("norm_type", "layernorm"),
    ("use_pre_encoder_decoder_layer_norm", False),
    ("use_projection_bias_in_attention", True),
    ("encoder_nonlinearity", "swiglu"),
    ("use_transformer_initialization", True),
]


@pytest.mark.parametrize("key, value", REFUSED)
def test_to_hf_refuses_a_t5_hf_cannot_express(tmp_path, key, value):
    keys = {"name": "t5", "src_vocab_size": V, "d_model": 16, "d_kv": 4, "d_ff": 24, "encoder_num_hidden_layers": 1,
            "num_heads": 4, key: value}
    model = build(keys)
    save({"model": model.state_dict()}, str(tmp_path / "m.mdl"))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"model": keys}))
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--to", "hf", str(tmp_path / "m.mdl"),
                                                 str(tmp_path / "out"), "--params", str(tmp_path / "p.yaml")])
    assert result.exit_code != 0
    assert f"model.{key}" in result.output and not (tmp_path / "out").exists()
