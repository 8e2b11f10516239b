"""dpr <-> Hugging Face DPR in the Model Zoo's layout (a folder of ``q_encoder/``: DPRQuestionEncoder and
``ctx_encoder/``: DPRContextEncoder): tiny random HF encoders converted with ``checkpoint convert --from hf``
give transformers' pooled embeddings within 1e-5 and the vendor's DPR loss (cross entropy of every question
against every context, by hand from transformers' embeddings) within 1e-5; ``--to hf`` writes both folders'
tensors back bit for bit; what HF's DPR cannot express is refused naming the key, and a folder that is not
a DPR folder is one error line."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner
from hf_helpers import TOL, build, tiny_hf, to_hf_is_refused

from cs_run.checkpoint import load, save
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")

V, L, B, C = 61, 10, 2, 2  # vocab, length, questions, contexts per question (the positive, one hard negative)
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, vocab_size=V,
             max_position_embeddings=16, layer_norm_eps=1e-5)
SIDES = {"q_encoder": "DPRQuestionEncoder", "ctx_encoder": "DPRContextEncoder"}


@pytest.fixture(scope="module")
def dpr_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpr")
    models = {}
    for seed, (side, cls) in enumerate(SIDES.items()):
        models[side] = tiny_hf("DPRConfig", cls, seed=seed, **SIZES)
        models[side].save_pretrained(str(root / side), safe_serialization=True)
    return root, models


def _batch() -> dict:
    g = torch.Generator().manual_seed(3)
    q = torch.randint(1, V, (B, L), generator=g)
    c = torch.randint(1, V, (B, C, L), generator=g)
    q_mask, c_mask = torch.ones(B, L, dtype=torch.int32), torch.ones(B, C, L, dtype=torch.int32)
    q[1, 7:], q_mask[1, 7:] = 0, 0
    c[0, 1, 5:], c_mask[0, 1, 5:] = 0, 0
    return {"questions_input_ids": q.int(), "questions_attention_mask": q_mask,
            "questions_token_type_ids": torch.zeros(B, L, dtype=torch.int32), "ctx_input_ids": c.int(),
            "ctx_attention_mask": c_mask, "ctx_token_type_ids": torch.zeros(B, C, L, dtype=torch.int32),
            "labels": torch.arange(B, dtype=torch.int32) * C}


def _convert(*args):
    return CliRunner().invoke(checkpoint_cli, ["convert", *map(str, args)])


def test_dpr_from_hf_matches_transformers_encoders_and_back_is_exact(tmp_path, dpr_folder):
    root, hf = dpr_folder
    result = _convert("--from", "hf", root, tmp_path / "dpr.mdl")
    assert result.exit_code == 0, result.output
    keys = yaml.safe_load((tmp_path / "dpr.yaml").read_text())["model"]
    assert keys["name"] == "dpr" and keys["pooler_type"] == "cls"
    model = build(keys)
    model.load_state_dict(load(str(tmp_path / "dpr.mdl"))["model"])
    batch = _batch()
    flat = {k: batch[k].reshape(B * C, L) for k in ("ctx_input_ids", "ctx_attention_mask")}
    with torch.no_grad():
        q_ref = hf["q_encoder"](input_ids=batch["questions_input_ids"],
                                attention_mask=batch["questions_attention_mask"]).pooler_output
        c_ref = hf["ctx_encoder"](input_ids=flat["ctx_input_ids"], attention_mask=flat["ctx_attention_mask"]).pooler_output
        _, _, q, c = model.model(**{k: v for k, v in batch.items() if k != "labels"})
        loss = model(dict(batch))
    torch.testing.assert_close(q, q_ref, **TOL)
    torch.testing.assert_close(c, c_ref, **TOL)
    expected = F.cross_entropy(q_ref @ c_ref.T, batch["labels"].long())  # the vendor's DPRLoss, temperature 1
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    result = _convert("--to", "hf", tmp_path / "dpr.mdl", tmp_path / "back", "--params", tmp_path / "dpr.yaml")
    assert result.exit_code == 0, result.output
    for side, cls in SIDES.items():
        theirs = st.load_file(str(root / side / "model.safetensors"))
        ours = st.load_file(str(tmp_path / "back" / side / "model.safetensors"))
        assert ours.keys() == {k for k in theirs if not k.endswith("position_ids")}
        assert all(torch.equal(theirs[k], v) for k, v in ours.items())
        config = json.loads((tmp_path / "back" / side / "config.json").read_text())
        assert config["architectures"] == [cls] and config["model_type"] == "dpr"
        reread = getattr(transformers, cls).from_pretrained(str(tmp_path / "back" / side)).eval()
        assert reread.config.hidden_size == SIZES["hidden_size"]


def test_a_shared_encoder_is_written_as_two_equal_folders(tmp_path):
    enc = {"vocab_size": V, "hidden_size": 32, "num_hidden_layers": 1, "num_heads": 4, "filter_size": 48,
           "max_position_embeddings": 16}
    keys = {"name": "dpr", "encoder": enc, "use_biencoder": False}
    torch.manual_seed(0)
    save({"model": build(keys).state_dict()}, str(tmp_path / "shared.mdl"))
    (tmp_path / "shared.yaml").write_text(yaml.safe_dump({"model": keys}))
    result = _convert("--to", "hf", tmp_path / "shared.mdl", tmp_path / "hf", "--params", tmp_path / "shared.yaml")
    assert result.exit_code == 0, result.output
    q = st.load_file(str(tmp_path / "hf" / "q_encoder" / "model.safetensors"))
    c = st.load_file(str(tmp_path / "hf" / "ctx_encoder" / "model.safetensors"))
    assert len(q) == len(c) and all(torch.equal(v, c[k.replace("question_encoder.", "ctx_encoder.", 1)])
                                    for k, v in q.items())


@pytest.mark.parametrize("change, key", [
    ({"pooler_type": "mean"}, "model.pooler_type"),
    ({"pooler_type": "ffn_pooler"}, "model.pooler_type"),
    ({"q_encoder": {"encoder_nonlinearity": "relu6"}}, "model.q_encoder.encoder_nonlinearity"),
    ({"ctx_encoder": {"use_ffn_bias": False}}, "model.ctx_encoder.use_ffn_bias"),
], ids=["mean", "ffn_pooler", "activation", "ffn-bias"])
def test_to_hf_refuses_a_dpr_hf_cannot_express(tmp_path, change, key):
    enc = {"vocab_size": V, "hidden_size": 32, "num_hidden_layers": 1, "num_heads": 4, "filter_size": 48,
           "max_position_embeddings": 16}
    keys = {"name": "dpr", "q_encoder": dict(enc), "ctx_encoder": dict(enc)}
    for name, value in change.items():
        keys[name] = {**keys[name], **value} if isinstance(value, dict) else value
    output = to_hf_is_refused(tmp_path, keys)
    assert key in output, output


@pytest.mark.parametrize("damage, message", [
    ("no ctx_encoder", "ctx_encoder/config.json not found"),
    ("projection", "projection_dim"),
    ("one layer short", "the weights do not match config.json"),
], ids=["missing-side", "projection", "layers"])
def test_bad_dpr_folders_are_one_error_line_and_write_nothing(tmp_path, dpr_folder, damage, message):
    root, hf = dpr_folder
    bad = tmp_path / "bad"
    for side in SIDES:
        hf[side].save_pretrained(str(bad / side), safe_serialization=True)
    if damage == "no ctx_encoder":
        for f in (bad / "ctx_encoder").iterdir():
            f.unlink()
        (bad / "ctx_encoder").rmdir()
        (bad / "other").mkdir()  # a second component folder, so the folder still reads as one model_type
        (bad / "other" / "config.json").write_text(json.dumps({"model_type": "dpr"}))
    cfg_path = bad / "q_encoder" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if damage == "projection":
        cfg["projection_dim"] = 8
    if damage == "one layer short":
        cfg["num_hidden_layers"] = 1
    cfg_path.write_text(json.dumps(cfg))
    result = _convert("--from", "hf", bad, tmp_path / "out.mdl")
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out.mdl").exists() and not (tmp_path / "out.yaml").exists()
