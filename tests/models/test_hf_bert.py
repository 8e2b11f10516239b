"""bert <-> Hugging Face BERT (BertForPreTraining) and RoBERTa (RobertaForMaskedLM): a tiny random HF model
converted with ``checkpoint convert --from hf`` computes transformers' logits within 1e-5 and the vendor's
loss (BertPretrainModelLoss, by hand from transformers' logits) within 1e-5; ``--to hf`` writes the folder's
tensors back bit for bit; a model HF cannot express is refused naming the key."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner
from hf_helpers import TOL, build, tiny_hf, to_hf_is_refused

from cs_run.checkpoint import load
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")

V, MSL, B, P = 53, 12, 3, 4  # vocab, sequence length, batch, predictions per sequence
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, vocab_size=V)


def _batch(pad: int) -> dict:
    """Sequences of 12, 9 and 7 tokens (the rest ``pad``), two segments, gathered MLM positions."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(2, V, (B, MSL), generator=g)
    mask = torch.ones(B, MSL, dtype=torch.int32)
    for row, length in enumerate((12, 9, 7)):
        ids[row, length:], mask[row, length:] = pad, 0
    segments = (torch.arange(MSL) >= 5).int().expand(B, -1) * mask
    positions = torch.tensor([[1, 3, 8, 11], [0, 2, 4, 0], [6, 1, 0, 0]], dtype=torch.int32)
    mlm_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.int32)
    labels = torch.randint(0, V, (B, P), generator=g, dtype=torch.int32) * mlm_mask
    return {"input_ids": ids.int(), "attention_mask": mask, "token_type_ids": segments, "labels": labels,
            "masked_lm_positions": positions, "masked_lm_mask": mlm_mask,
            "next_sentence_label": torch.tensor([[0], [1], [1]], dtype=torch.int32)}


def _vendor_loss(mlm_logits, nsp_logits, batch, mlm_loss_weight) -> torch.Tensor:
    """BertPretrainModelLoss by hand: sum of masked per-position cross entropy / batch * weight + NSP mean."""
    ce = F.cross_entropy(mlm_logits.reshape(-1, V), batch["labels"].reshape(-1).long(), reduction="none")
    loss = (ce * batch["masked_lm_mask"].reshape(-1)).sum() / B * mlm_loss_weight
    if nsp_logits is not None:
        loss = loss + F.cross_entropy(nsp_logits, batch["next_sentence_label"].reshape(-1).long())
    return loss


def _convert(*args) -> None:
    result = CliRunner().invoke(checkpoint_cli, ["convert", *map(str, args)])
    assert result.exit_code == 0, result.output


def _ours(tmp_path, hf_dir, mlm_loss_weight: float):
    _convert("--from", "hf", hf_dir, tmp_path / "model.mdl")
    keys = yaml.safe_load((tmp_path / "model.yaml").read_text())["model"]
    assert keys["name"] == "bert"
    model = build({**keys, "mlm_loss_weight": mlm_loss_weight})
    model.load_state_dict(load(str(tmp_path / "model.mdl"))["model"])
    return keys, model


def _gathered(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return torch.gather(logits, 1, positions.long()[..., None].expand(-1, -1, logits.shape[-1]))


def _round_trip_is_exact(tmp_path, hf_dir) -> None:
    _convert("--to", "hf", tmp_path / "model.mdl", tmp_path / "back", "--params", tmp_path / "model.yaml")
    theirs = st.load_file(str(hf_dir / "model.safetensors"))
    ours = st.load_file(str(tmp_path / "back" / "model.safetensors"))
    assert ours.keys() <= theirs.keys()
    for key, value in ours.items():
        assert torch.equal(theirs[key], value), key


def test_bert_from_hf_matches_bert_for_pretraining_and_back_is_exact(tmp_path):
    hf = tiny_hf("BertConfig", "BertForPreTraining", max_position_embeddings=16, layer_norm_eps=1e-5, **SIZES)
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    batch = _batch(pad=0)
    with torch.no_grad():
        out = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 token_type_ids=batch["token_type_ids"])
    keys, model = _ours(tmp_path, tmp_path / "hf", 0.058)
    with torch.no_grad():
        mlm, nsp = model.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        loss = model(dict(batch))
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(mlm[mask], out.prediction_logits[mask], **TOL)  # padded rows differ by design
    torch.testing.assert_close(nsp, out.seq_relationship_logits, **TOL)
    expected = _vendor_loss(_gathered(out.prediction_logits, batch["masked_lm_positions"]),
                            out.seq_relationship_logits, batch, 0.058)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    _round_trip_is_exact(tmp_path, tmp_path / "hf")
    assert json.loads((tmp_path / "back" / "config.json").read_text())["model_type"] == "bert"


def test_roberta_from_hf_matches_roberta_for_masked_lm_and_back_is_exact(tmp_path):
    """The Model Zoo's roberta_large layout: no NSP, pad id 0, positions that skip padding."""
    hf = tiny_hf("RobertaConfig", "RobertaForMaskedLM", max_position_embeddings=MSL + 1, pad_token_id=0,
                 type_vocab_size=1, layer_norm_eps=1e-5, **SIZES)
    with torch.no_grad():  # as --to hf writes it (the vendor has no token types without NSP): exact both ways
        hf.roberta.embeddings.token_type_embeddings.weight.zero_()
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    batch = {k: v for k, v in _batch(pad=0).items() if k not in ("token_type_ids", "next_sentence_label")}
    with torch.no_grad():
        out = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    keys, model = _ours(tmp_path, tmp_path / "hf", 0.019)
    assert keys["disable_nsp"] and keys["mask_padding_in_positional_embed"] and keys["max_position_embeddings"] == MSL
    with torch.no_grad():
        mlm, nsp = model.model(batch["input_ids"], batch["attention_mask"])
        loss = model(dict(batch))
    assert nsp is None
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(mlm[mask], out.logits[mask], **TOL)
    expected = _vendor_loss(_gathered(out.logits, batch["masked_lm_positions"]), None, batch, 0.019)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    _round_trip_is_exact(tmp_path, tmp_path / "hf")
    again = transformers.RobertaForMaskedLM.from_pretrained(str(tmp_path / "back")).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                                   out.logits, **TOL)


def test_roberta_token_type_row_is_folded_into_the_positions(tmp_path):
    """HF's RoBERTa adds its one token-type row everywhere: --from hf keeps the logits (within 1e-5)."""
    hf = tiny_hf("RobertaConfig", "RobertaForMaskedLM", max_position_embeddings=MSL + 1, pad_token_id=0,
                 type_vocab_size=1, **SIZES)
    assert hf.roberta.embeddings.token_type_embeddings.weight.abs().min() > 0
    hf.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
    batch = _batch(pad=0)
    _, model = _ours(tmp_path, tmp_path / "hf", 1.0)
    with torch.no_grad():
        theirs = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        ours, _ = model.model(batch["input_ids"], batch["attention_mask"])
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[mask], theirs[mask], **TOL)


BASE = dict(name="bert", vocab_size=V, hidden_size=32, num_hidden_layers=1, num_heads=4, filter_size=48,
            max_position_embeddings=16, pooler_nonlinearity="tanh")


@pytest.mark.parametrize("change, key", [
    (dict(mlm_nonlinearity="relu"), "mlm_nonlinearity"),
    (dict(pooler_nonlinearity="gelu"), "pooler_nonlinearity"),
    (dict(norm_first=True), "norm_first"),
    (dict(use_output_bias_in_mlm=False), "use_output_bias_in_mlm"),
    (dict(embedding_layer_norm=False), "embedding_layer_norm"),
    (dict(disable_nsp=True), "disable_nsp"),
    (dict(mup_base_hidden_size=16, mup_base_filter_size=24), "mup_base_"),
])
def test_to_hf_refuses_a_bert_hf_cannot_express(tmp_path, change, key):
    output = to_hf_is_refused(tmp_path, {**BASE, **change})
    line = [x for x in output.splitlines() if x.startswith("Error:")]
    assert len(line) == 1 and f"model.{key}" in line[0], output  # one line, naming the key
