"""dpr (Release 2.10 models/nlp/dpr, params_dpr_base_nq.yaml shrunk by tools/modelzoo_files.py: sizes, batch,
steps and data paths only): the first loss against the contrastive loss computed by hand from transformers'
BertModel run on the same weights (each encoder's first-token state; in-batch and hard negatives), the loss's
mutual-information mix and mean pooling by hand, bad keys, and the file validating and training 5 steps on CPU
and CSX fx with the same losses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hf_helpers import build
from modelzoo_file_helpers import TAG, in_process, mz, needs_mirror, shrunk, train_flat_file_3_cpu_steps, train_on_cpu_and_csx, write

from cs_run.data.processors.dpr import build_dataloader
from cs_run.models.bert_classifier.hf import head_names
from cs_run.models.dpr.model import DPRConfig, dpr_loss, mean_pooling


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dpr")
    mz.write_dpr_data(out)
    return out


def _shrunk(data: Path, tmp_path: Path, tag: str = TAG) -> dict:
    return shrunk("src/cerebras/modelzoo/models/nlp/dpr/configs/params_dpr_base_nq.yaml", data, tmp_path, tag)


def _hf_encoder(model, prefix: str, keys: dict):
    """transformers' BertModel (no pooler) holding the weights of our encoder at ``prefix``."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=keys["vocab_size"], hidden_size=keys["hidden_size"],
                                  num_hidden_layers=keys["num_hidden_layers"], num_attention_heads=keys["num_heads"],
                                  intermediate_size=keys["filter_size"], hidden_act=keys["encoder_nonlinearity"],
                                  max_position_embeddings=keys["max_position_embeddings"], type_vocab_size=2,
                                  layer_norm_eps=keys["layer_norm_epsilon"], hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    hf = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    sd = model.state_dict()
    pairs = [(h.removeprefix("bert."), o.replace("model.bert.", prefix)) for h, o in
             head_names(keys["num_hidden_layers"], pooler=False) if h.startswith("bert.")]
    missing, unexpected = hf.load_state_dict({h: sd[o] for h, o in pairs}, strict=False)
    assert not unexpected and all("position_ids" in k for k in missing)
    return hf


@needs_mirror
def test_first_loss_is_the_contrastive_loss_of_transformers_encoders(tmp_path, data):
    trainer = _shrunk(data, tmp_path)["trainer"]
    keys = trainer["init"]["model"]
    for side in ("q_encoder", "ctx_encoder"):
        keys[side] = {**keys[side], "dropout_rate": 0.0, "attention_dropout_rate": 0.0}
    torch.manual_seed(1)
    model = build(keys)
    batch = next(iter(build_dataloader("train", **{**trainer["fit"]["train_dataloader"], "num_workers": 0})))
    with torch.no_grad():
        ours = model(dict(batch)).item()
    assert keys["q_encoder"]["hidden_size"] == 64 and batch["ctx_input_ids"].shape == (4, 2, 32)
    q_hf = _hf_encoder(model, "model.question_encoder.", keys["q_encoder"])
    c_hf = _hf_encoder(model, "model.ctx_encoder.", keys["ctx_encoder"])
    with torch.no_grad():
        q = q_hf(input_ids=batch["questions_input_ids"].long(), attention_mask=batch["questions_attention_mask"],
                 token_type_ids=batch["questions_token_type_ids"].long()).last_hidden_state[:, 0]
        c = c_hf(input_ids=batch["ctx_input_ids"].flatten(0, 1).long(),
                 attention_mask=batch["ctx_attention_mask"].flatten(0, 1),
                 token_type_ids=batch["ctx_token_type_ids"].flatten(0, 1).long()).last_hidden_state[:, 0]
    scores = q @ c.T  # [4 questions, 8 contexts]: question i's positive is context 2i, the rest negatives
    log_softmax = scores - torch.logsumexp(scores, dim=1, keepdim=True)
    expected = -torch.stack([log_softmax[i, 2 * i] for i in range(4)]).mean()
    assert ours == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)


def test_mutual_information_mixes_the_two_losses_by_hand():
    g = torch.Generator().manual_seed(0)
    q2c, c2q = torch.randn(3, 9, generator=g), torch.randn(3, 3, generator=g)  # 3 contexts per question
    labels, context_labels = torch.arange(3) * 3, torch.arange(3)

    def ce(scores, target):
        return -torch.stack([torch.log_softmax(scores[i], 0)[target[i]] for i in range(len(target))]).mean()
    t = 0.5
    assert dpr_loss(q2c, labels, t).item() == pytest.approx(ce(q2c / t, labels).item(), rel=1e-6)
    both = 0.75 * ce(q2c / t, labels) + 0.25 * ce(c2q / t, context_labels)  # 1 / (1 + 3) to the c2q loss
    assert dpr_loss(q2c, labels, t, c2q, context_labels).item() == pytest.approx(both.item(), rel=1e-6)


def test_mean_pooling_averages_the_unmasked_tokens():
    hidden = torch.arange(24, dtype=torch.float32).view(2, 3, 4)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    expected = torch.stack([(hidden[0, 0] + hidden[0, 1]) / 2, hidden[1, 0]])
    torch.testing.assert_close(mean_pooling(hidden, mask), expected)


ENC = {"vocab_size": 97, "hidden_size": 16, "num_hidden_layers": 1, "num_heads": 2, "filter_size": 32,
       "max_position_embeddings": 16}


@pytest.mark.parametrize("keys, match", [
    ({"q_encoder": {**ENC, "hiden_size": 8}, "ctx_encoder": ENC}, r"q_encoder\.hiden_size: not a key"),
    ({"q_encoder": ENC, "ctx_encoder": {**ENC, "num_heads": 3}}, r"ctx_encoder\.hidden_size: 16 is not divisible"),
    ({"q_encoder": ENC}, "q_encoder: give both q_encoder and ctx_encoder, or only encoder"),
    ({"q_encoder": ENC, "ctx_encoder": ENC, "encoder": ENC}, "q_encoder: give both"),
    ({"q_encoder": ENC, "ctx_encoder": ENC, "use_biencoder": False}, "use_biencoder: false shares one encoder"),
    ({"encoder": ENC, "pooler_type": "max"}, "pooler_type: 'max' is not one of mean, cls, ffn_pooler"),
    ({"encoder": 7}, "encoder: expected a mapping"),
    ({"encoder": ENC, "softmax_temperature": 0.0}, "softmax_temperature: must be > 0"),
    ({"q_encoder": {**ENC, "fp16_type": "half"}, "ctx_encoder": ENC}, r"q_encoder\.fp16_type: 'half' is not one of"),
    ({"encoder": {**ENC, "mixed_precision": "yes"}}, r"encoder\.mixed_precision: expected true or false"),
    ({"encoder": ENC, "scale_similarity": True, "mutual_information": True}, "scale_similarity: Release 2.2's key"),
])
def test_bad_keys_are_errors_naming_the_key(keys, match):
    with pytest.raises(ValueError, match=match):
        DPRConfig(**keys)


def test_scale_similarity_divides_the_scores_by_the_root_of_the_width_by_hand():
    """Release 2.2's scale_similarity: the loss is the cross entropy of q @ c.T / sqrt(16), from the embeddings."""
    g = torch.Generator().manual_seed(3)
    batch = {"questions_input_ids": torch.randint(1, 97, (3, 6), generator=g),
             "ctx_input_ids": torch.randint(1, 97, (3, 2, 6), generator=g)}
    batch.update(questions_attention_mask=torch.ones(3, 6, dtype=torch.int32),
                 questions_token_type_ids=torch.zeros(3, 6, dtype=torch.int32),
                 ctx_attention_mask=torch.ones(3, 2, 6, dtype=torch.int32),
                 ctx_token_type_ids=torch.zeros(3, 2, 6, dtype=torch.int32), labels=torch.arange(3) * 2)
    enc = {**ENC, "dropout_rate": 0.0, "attention_dropout_rate": 0.0}
    torch.manual_seed(0)
    model = build({"name": "dpr", "q_encoder": enc, "ctx_encoder": enc, "scale_similarity": True})
    with torch.no_grad():
        loss = model(dict(batch)).item()
        _, _, q, c = model.model(**{k: v for k, v in batch.items() if k != "labels"})
    scores = (q @ c.T) / 4.0  # hidden_size 16
    expected = -torch.stack([torch.log_softmax(scores[i], 0)[2 * i] for i in range(3)]).mean()
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    assert loss != pytest.approx(dpr_loss(q @ c.T, batch["labels"], 1.0).item(), rel=1e-3)  # it does scale


def test_an_encoders_precision_keys_change_nothing():
    """Release 2.2/2.3's q_encoder.mixed_precision / fp16_type: read by no vendor code, the same model here."""
    torch.manual_seed(0)
    plain = build({"name": "dpr", "q_encoder": ENC, "ctx_encoder": ENC}).state_dict()
    torch.manual_seed(0)
    marked = {**ENC, "mixed_precision": True, "fp16_type": "cbfloat16"}
    with_keys = build({"name": "dpr", "q_encoder": marked, "ctx_encoder": marked}).state_dict()
    assert plain.keys() == with_keys.keys() and all(torch.equal(plain[k], with_keys[k]) for k in plain)


@needs_mirror
@pytest.mark.slow
def test_file_validates_and_trains_5_steps_on_cpu_and_csx(tmp_path, data):
    cpu, csx = train_on_cpu_and_csx(write(in_process(_shrunk(data, tmp_path)), tmp_path / "p.yaml"), tmp_path)
    assert [step for step, _ in cpu] == [1, 2, 3, 4, 5]
    assert cpu == csx and all(np.isfinite(loss) for _, loss in cpu)


@needs_mirror
@pytest.mark.slow
def test_the_release_2_2_and_2_3_files_validate_and_train_3_cpu_steps(tmp_path, data):
    """Refused before (model.scale_similarity at 2.2, q_encoder.fp16_type at 2.2 and 2.3): the flat files."""
    for tag in ("Release_2.2.0", "Release_2.3.0"):
        params = _shrunk(data, tmp_path / tag, tag)
        assert params["model"]["q_encoder"]["fp16_type"] == "cbfloat16"
        assert ("scale_similarity" in params["model"]) == (tag == "Release_2.2.0")
        losses = train_flat_file_3_cpu_steps(params, tmp_path / f"{tag}.yaml", tmp_path / tag)
        assert [step for step, _ in losses] == [1, 2, 3] and all(np.isfinite(loss) for _, loss in losses)
