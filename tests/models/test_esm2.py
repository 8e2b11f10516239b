"""esm2 (the Model Zoo's ESM-2): token dropout by hand (esm2_model.py's rule), ESM-2's config checks as a table,
and Hugging Face both ways: a tiny random EsmForMaskedLM converted with ``checkpoint convert --from hf`` gives
transformers' logits within 1e-5 and, with the loss weight that makes the vendor's sum / batch a mean,
transformers' loss within 1e-5; ``--to hf`` writes the folder's tensors back bit for bit; a model HF cannot
express is refused naming the key."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from click.testing import CliRunner
from hf_helpers import TOL, build, tiny_hf

from cs_run.checkpoint import load, save
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli

V, MSL, B, MASK, PAD = 33, 12, 3, 32, 1  # ESM-2's vocabulary, its mask and pad ids
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, vocab_size=V)
KEYS = dict(name="esm2", vocab_size=V, hidden_size=32, num_hidden_layers=2, num_heads=4, filter_size=48,
            max_position_embeddings=16, position_embedding_type="rotary", rotary_dim=8, disable_nsp=True,
            embedding_layer_norm=False, use_final_layer_norm=True, token_dropout=True, mask_token_id=MASK,
            pad_token_id=PAD, dropout_rate=0.0, attention_dropout_rate=0.0, layer_norm_epsilon=1e-5)
LENGTHS = (12, 9, 7)
MASKED = [[1, 3, 8, 11], [0, 2, 4], [6]]  # the positions that hold the mask token: 4, 3 and 1 per sequence


def _batch() -> dict:
    """Sequences of 12, 9 and 7 amino-acid ids (the rest padding), some positions masked, gathered labels."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(4, 24, (B, MSL), generator=g)
    mask = torch.ones(B, MSL, dtype=torch.int32)
    positions = torch.zeros(B, 4, dtype=torch.int32)
    mlm_mask = torch.zeros(B, 4, dtype=torch.int32)
    for row, (length, masked) in enumerate(zip(LENGTHS, MASKED)):
        ids[row, length:], mask[row, length:] = PAD, 0
        ids[row, masked] = MASK
        positions[row, :len(masked)] = torch.tensor(masked)
        mlm_mask[row, :len(masked)] = 1
    labels = torch.randint(4, 24, (B, 4), generator=g, dtype=torch.int32) * mlm_mask
    return {"input_ids": ids.int(), "attention_mask": mask, "labels": labels, "masked_lm_positions": positions,
            "masked_lm_mask": mlm_mask}


def test_token_dropout_zeroes_the_mask_rows_and_scales_by_the_masked_share():
    """esm2_model.py: mask rows zeroed, every row times (1 - 0.15 * 0.8) / (1 - masked / unpadded length)."""
    model = build(KEYS)
    batch = _batch()
    table = model.model.bert_encoder.embedding_layer.word_embeddings.weight.detach()
    expected = table[batch["input_ids"].long()].clone()
    for row, (length, masked) in enumerate(zip(LENGTHS, MASKED)):
        expected[row, masked] = 0.0
        expected[row] *= (1 - 0.12) / (1 - len(masked) / length)
    with torch.no_grad():
        ours = model.model.bert_encoder.compute_input_embeddings(batch["input_ids"], batch["attention_mask"], None)
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=1e-7)
    plain = build({**KEYS, "token_dropout": False})
    with torch.no_grad():
        unscaled = plain.model.bert_encoder.compute_input_embeddings(batch["input_ids"], batch["attention_mask"], None)
    assert torch.equal(unscaled, plain.model.bert_encoder.embedding_layer.word_embeddings(batch["input_ids"]))


@pytest.mark.parametrize("change, key", [
    (dict(mask_token_id=None), "mask_token_id"),  # token_dropout needs it
    (dict(mask_token_id=V), "mask_token_id"),
    (dict(rotary_dim=7), "rotary_dim"),
    (dict(rotary_dim=10), "rotary_dim"),  # more than the head (32 / 4)
    (dict(position_embedding_type="alibi"), "position_embedding_type"),
])
def test_bad_esm2_keys_name_the_key(change, key):
    with pytest.raises(ValueError, match=rf"^{key}: "):
        build({**KEYS, **change})


def test_rotary_dim_defaults_to_a_quarter_of_the_head():
    """bert_model.py's post_init: int(hidden_size / num_heads * 0.25)."""
    keys = {k: v for k, v in KEYS.items() if k != "rotary_dim"}
    assert build({**keys, "hidden_size": 64})._modules["model"].bert_encoder.embedding_layer.rotary.rotary_dim == 4


def _convert(*args) -> None:
    result = CliRunner().invoke(checkpoint_cli, ["convert", *map(str, args)])
    assert result.exit_code == 0, result.output


def test_esm2_from_hf_matches_esm_for_masked_lm_and_back_is_exact(tmp_path):
    transformers = pytest.importorskip("transformers")
    st = pytest.importorskip("safetensors.torch")
    hf = tiny_hf("EsmConfig", "EsmForMaskedLM", max_position_embeddings=16, layer_norm_eps=1e-5, mask_token_id=MASK,
                 pad_token_id=PAD, position_embedding_type="rotary", token_dropout=True, emb_layer_norm_before=False,
                 **SIZES)
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    batch = _batch()
    hf_labels = torch.full((B, MSL), -100)
    for row, masked in enumerate(MASKED):
        hf_labels[row, masked] = batch["labels"][row, :len(masked)].long()
    with torch.no_grad():
        out = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=hf_labels)
    _convert("--from", "hf", tmp_path / "hf", tmp_path / "model.mdl")
    keys = yaml.safe_load((tmp_path / "model.yaml").read_text())["model"]
    assert keys["name"] == "esm2" and keys["rotary_dim"] == 8 and keys["token_dropout"]
    weight = B / sum(map(len, MASKED))  # the vendor's sum over masked positions / batch is then their mean
    model = build({**keys, "mlm_loss_weight": weight})
    model.load_state_dict(load(str(tmp_path / "model.mdl"))["model"])
    with torch.no_grad():
        mlm, nsp = model.model(batch["input_ids"], batch["attention_mask"])
        loss = model(dict(batch))
    assert nsp is None
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(mlm[keep], out.logits[keep], **TOL)  # padded rows differ by design (hf.py)
    assert loss.item() == pytest.approx(out.loss.item(), rel=1e-5, abs=1e-6)
    _convert("--to", "hf", tmp_path / "model.mdl", tmp_path / "back", "--params", tmp_path / "model.yaml")
    # transformers 5 saves ESM's layer norms as LayerNorm.gamma / .beta (and loads both): --to hf writes weight / bias
    theirs = {k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): v
              for k, v in st.load_file(str(tmp_path / "hf" / "model.safetensors")).items()}
    ours = st.load_file(str(tmp_path / "back" / "model.safetensors"))
    assert {k for k in theirs if "contact_head" not in k and "inv_freq" not in k} <= ours.keys() <= theirs.keys()
    for key, value in ours.items():
        if "contact_head" not in key:  # EsmForMaskedLM never reads it: written as zeros
            assert torch.equal(theirs[key], value), key
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == "esm"
    again = transformers.EsmForMaskedLM.from_pretrained(str(tmp_path / "back")).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                                   out.logits, **TOL)


@pytest.mark.parametrize("change, key", [
    (dict(rotary_dim=4), "rotary_dim"),  # HF rotates the whole head
    (dict(norm_first=False), "norm_first"),
    (dict(use_final_layer_norm=False), "use_final_layer_norm"),
    (dict(encoder_nonlinearity="relu"), "encoder_nonlinearity"),
    (dict(mlm_nonlinearity="relu"), "mlm_nonlinearity"),
    (dict(disable_nsp=False), "disable_nsp"),
    (dict(position_embedding_type="learned"), "position_embedding_type"),
])
def test_to_hf_refuses_an_esm2_hf_cannot_express(tmp_path, change, key):
    keys = {**KEYS, **change}
    model = build(keys)
    save({"model": model.state_dict()}, str(tmp_path / "model.mdl"))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"model": keys}))
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--to", "hf", str(tmp_path / "model.mdl"),
                                                 str(tmp_path / "out"), "--params", str(tmp_path / "params.yaml")])
    assert result.exit_code != 0
    line = [x for x in result.output.splitlines() if x.startswith("Error:")]
    assert len(line) == 1 and f"model.{key}" in line[0], result.output  # one line, naming the key
    assert not (tmp_path / "out").exists()
