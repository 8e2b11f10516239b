"""The five bert pretraining files of Model Zoo Release 2.10 (bert_base/large MSL128/512, the muP one,
roberta_large), shrunk by tools/modelzoo_files.py (sizes, batch, steps and data paths only): the first batch's
loss equals the vendor's loss computed by hand from transformers' logits with the same weights (BERT and
RoBERTa), and every file passes validate-only and trains 5 steps on CPU and on CSX (fx)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hf_helpers import build
from modelzoo_file_helpers import mz, needs_mirror, run_file, shrunk

from cs_run.data.processors.bert import build_dataloader
from cs_run.models.bert.hf import hf_config, to_hf_state_dict
from tests.modelzoo_marks import first_in_suite_rest_in_sweep

transformers = pytest.importorskip("transformers")
FILES = ["bert_base_MSL128", "bert_base_MSL512", "bert_large_MSL512", "bert_large_MSL512_muP", "roberta_large"]
pytestmark = needs_mirror


def _path(name: str) -> str:
    return f"src/cerebras/modelzoo/models/nlp/bert/configs/{name}.yaml"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bert_csv")
    mz.write_bert_csv(out)
    return out


def _shrunk(name: str, data: Path, tmp_path: Path) -> dict:
    return shrunk(_path(name), data, tmp_path)


@pytest.mark.parametrize("name, hf_class", [("bert_base_MSL128", "BertForPreTraining"),
                                            ("roberta_large", "RobertaForMaskedLM")])
def test_first_loss_is_the_vendor_loss_of_transformers_logits(tmp_path, data, name, hf_class):
    init = _shrunk(name, data, tmp_path)["trainer"]
    keys = dict(init["init"]["model"])
    section = {**init["fit"]["train_dataloader"], "num_workers": 0}
    torch.manual_seed(1)
    model = build(keys)
    batch = next(iter(build_dataloader("train", **section, disable_nsp=keys.get("disable_nsp", False))))
    with torch.no_grad():
        ours = model(dict(batch)).item()
        our_logits, _ = model.model(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                                    batch["masked_lm_positions"])
    config = hf_config(model.config)
    assert config["architectures"] == [hf_class]
    hf = getattr(transformers, hf_class)(transformers.AutoConfig.for_model(**config)).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model), strict=False)
    assert not unexpected and all(".decoder." in k for k in missing)  # the tied decoder copies only
    hf.tie_weights()
    with torch.no_grad():
        out = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 **({"token_type_ids": batch["token_type_ids"]} if "token_type_ids" in batch else {}))
    logits = out.logits if hf_class == "RobertaForMaskedLM" else out.prediction_logits
    positions = batch["masked_lm_positions"].long()[..., None].expand(-1, -1, logits.shape[-1])
    gathered = torch.gather(logits, 1, positions)
    # fresh weights give near-uniform logits, whose loss hides small differences: the logits themselves, too
    torch.testing.assert_close(our_logits, gathered, rtol=1e-5, atol=1e-5)
    ce = F.cross_entropy(gathered.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1).long(), reduction="none")
    b = batch["input_ids"].shape[0]
    expected = (ce * batch["masked_lm_mask"].reshape(-1)).sum() / b * keys["mlm_loss_weight"]
    if hf_class == "BertForPreTraining":
        expected = expected + F.cross_entropy(out.seq_relationship_logits, batch["next_sentence_label"].reshape(-1).long())
    assert ours == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("command, device", [("validate-only", "CPU"), ("train", "CPU"), ("train", "CSX")])
@pytest.mark.parametrize("name", first_in_suite_rest_in_sweep(FILES, keep=["bert_large_MSL512_muP"]))
def test_the_five_files_validate_and_train_five_steps(tmp_path, data, name, command, device):
    result = run_file(_path(name), data, tmp_path, command, device)
    assert result["first_error"] == "ok", (name, result)
    if command == "train":
        assert (Path(result["params"]).parent / "model_dir" / "checkpoint_5.mdl").is_file(), name  # 5 steps
