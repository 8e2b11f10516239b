"""The Release 2.10 t5 params files (t5_3B, t5_11B, t5_11B_muP; muP's scales are test_t5_mup.py's),
shrunk by tools/modelzoo_files.py (sizes, batch, steps and data paths only) over text written in the vendor's
layout: validate-only, 5 training steps on CPU and 5 on CSX fx with the same losses, and the first batch's logits
within 1e-5 and loss within 1e-5 of transformers' T5ForConditionalGeneration with the same weights (for that
comparison only: norm_type rmsnorm, as HF's T5 has no LayerNorm, and no dropout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hf_helpers import TOL, build
from modelzoo_file_helpers import in_process_every_step, mz, needs_mirror, shrunk, train_on_cpu_and_csx, write

from cs_run.data.processors.t5 import build_dataloader
from cs_run.models.t5.hf import hf_config, to_hf_state_dict
from cs_run.params import load_params
from cs_run.runners import build_lr_scheduler, build_optimizer
from tests.modelzoo_marks import first_in_suite_rest_in_sweep

transformers = pytest.importorskip("transformers")
FILES = ["t5_3B", "t5_11B"]
MUP_FILE = "t5_11B_muP"
pytestmark = needs_mirror


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("t5_text")
    mz.write_t5_text(out)
    return out


def _shrunk(name: str, data: Path, tmp_path: Path) -> dict:
    return shrunk(f"src/cerebras/modelzoo/models/nlp/t5/configs/{name}.yaml", data, tmp_path)


def _write(params: dict, path: Path) -> Path:
    return write(in_process_every_step(params), path)


@pytest.mark.slow
@pytest.mark.parametrize("name", first_in_suite_rest_in_sweep([*FILES, MUP_FILE], keep=[MUP_FILE]))
def test_file_validates_and_trains_5_steps_on_cpu_and_csx(tmp_path, data, name):
    cpu, csx = train_on_cpu_and_csx(_write(_shrunk(name, data, tmp_path), tmp_path / "p.yaml"), tmp_path)
    assert [step for step, _ in cpu] == [1, 2, 3, 4, 5]
    assert cpu == csx and all(np.isfinite(loss) for _, loss in cpu)


def test_the_mup_file_builds_the_vendors_mup_model(tmp_path, data):
    """The shrunk file's muP (d_model 64 over base 512, d_ff 128 over base 2048): the multipliers of
    t5_model.py by hand, and a first loss that is finite."""
    trainer = _shrunk(MUP_FILE, data, tmp_path)["trainer"]
    torch.manual_seed(1)
    model = build(trainer["init"]["model"])
    m = 64 / 512
    assert model.model.embeddings_scale == pytest.approx(14.6 * 64 ** 0.5)
    assert model.model.output_logits_scale == pytest.approx(2.22 / m ** 0.5)  # scale_output_logits_by_d false
    scales = {k: g["scale"] for k, g in model.lr_adjustment_groups.items()}
    assert scales["encoder_input_ffn"] == pytest.approx(1 / m) and scales["lm_head"] == pytest.approx(m ** -0.5)
    assert scales["decoder_output_ffn"] == pytest.approx(2048 / 128)
    batch = next(iter(build_dataloader("train", **{**trainer["fit"]["train_dataloader"], "num_workers": 0})))
    model.train()
    assert torch.isfinite(model(dict(batch)))


def test_the_mup_files_optimizer_scales_each_groups_learning_rate(tmp_path, data):
    """The runner's optimizer and schedule of the muP file (no adjust_learning_rate in it: the vendor's trainer
    groups every model): at step 100 each weight's lr is the norms' lr times its muP factor, by hand."""
    raw = _shrunk(MUP_FILE, data, tmp_path)
    params = load_params(_write(raw, tmp_path / "p.yaml"))
    model = build(raw["trainer"]["init"]["model"])
    optimizer = build_optimizer(params.optimizer, model)
    schedule = build_lr_scheduler(params.optimizer, optimizer)
    schedule.load_state_dict({"last_epoch": 100})
    lr = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    m = 64 / 512
    base = lr[id(model.model.encoder.norm.weight)]
    assert base > 0
    for name, p in model.named_parameters():
        if "embedding" in name:  # word embeddings and relative position biases
            want = m ** -0.5
        elif "attn.proj_" in name:
            want = m ** -0.5
        elif "ffn.ffn.0" in name:
            want = 1 / m
        elif "ffn.ffn.1" in name:
            want = 2048 / 128
        else:
            want = 1.0
        assert float(lr[id(p)]) == pytest.approx(float(base) * want, rel=1e-6), name


@pytest.mark.parametrize("name", FILES)
def test_first_loss_is_transformers_loss_with_the_same_weights(tmp_path, data, name):
    trainer = _shrunk(name, data, tmp_path)["trainer"]
    keys = {**trainer["init"]["model"], "norm_type": "rmsnorm", "dropout_rate": 0.0}
    section = {**trainer["fit"]["train_dataloader"], "num_workers": 0}
    torch.manual_seed(1)
    model = build(keys)
    batch = next(iter(build_dataloader("train", **section)))
    with torch.no_grad():
        ours = model(dict(batch)).item()
        logits = model.model(batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"])
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(**hf_config(model.config))).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model), strict=False)
    assert not unexpected and all(k.endswith(("embed_tokens.weight", "lm_head.weight")) for k in missing)  # tied
    hf.tie_weights()
    with torch.no_grad():
        out = hf(input_ids=batch["input_ids"].long(), attention_mask=batch["attention_mask"],
                 decoder_input_ids=batch["decoder_input_ids"].long())
    torch.testing.assert_close(logits, out.logits, **TOL)
    # T5ForConditionalGenerationLoss, batch_size scaling: masked sum / batch * lm_loss_weight (0.015 in both files)
    ce = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), batch["labels"].reshape(-1).long(),
                         reduction="none")
    expected = (ce * batch["decoder_attention_mask"].reshape(-1)).sum() / batch["labels"].shape[0] * 0.015
    assert keys["lm_loss_weight"] == 0.015
    assert ours == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
