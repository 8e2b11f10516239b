"""What ``cs-run data preprocess --config`` writes for bert and esm2 trains them (issue 39 part 2).

The Model Zoo 2.10 files that read masked-LM HDF5 shards name BertHDF5DataProcessor (the esm2 files); it reads
``training_objective: mlm`` output (``data`` and ``labels``), which the esm2 config writes. The bert config's
``bert_pretraining`` output (unmasked ids and token types, no labels) is read by no 2.10 data processor (the
bert files read CSV), so bert trains here from ``training_objective: mlm`` shards of a BERT tokenizer, as a
user of the vendor's tool would make them. Each case preprocesses the recorded inputs, checks that the
processor's first batch is the written rows and that the model's first loss is the vendor's loss by hand
(masked cross entropy over the drawn positions only, summed / batch * mlm_loss_weight), then trains the
shrunk Release 2.10 file 5 steps on CPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from hf_helpers import build
from modelzoo_file_helpers import mz, needs_mirror, shrunk

from cs_run.data.preprocessing.vendor_config import preprocess_config
from cs_run.data.processors.bert import build_dataloader as bert_data
from cs_run.errors import DataError
from cs_run.summaries import read_scalars

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "vendor_preprocess"
BERT_SPECIALS = ["[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]"]


def _bert_mlm(params: dict) -> None:
    """The esm2 config made for BERT: the WordPiece folder, text records, BERT's specials never drawn."""
    params["setup"]["data"]["source"] = str(GOLDEN / "inputs" / "mixed")
    params["processing"]["huggingface_tokenizer"] = str(GOLDEN / "tokenizer_bert")
    for key in ("eos_id", "pad_id"):
        params["processing"].pop(key)
    params["dataset"]["excluded_tokens"] = BERT_SPECIALS


# (case id, recorded case whose config runs, its edit, the Release 2.10 params file, model keys set)
CASES = [
    ("esm2", "esm2_mlm", None, "esm2/configs/params_esm2_t12_35M_UR50D", {"vocab_size": 33}),
    ("esm2-no-gather", "esm2_mlm_no_gather", lambda p: p["dataset"].pop("ignore_index"),
     "esm2/configs/params_esm2_t12_35M_UR50D", {"vocab_size": 33}),
    ("bert", "esm2_mlm", _bert_mlm, "bert/configs/bert_base_MSL128", {"disable_nsp": True}),
]


def _preprocess(case: str, edit, out: Path) -> Path:
    text = (GOLDEN / case / "config.yaml").read_text().replace("<IN>", str(GOLDEN / "inputs"))
    params = yaml.safe_load(text.replace("<OUT>", str(out)).replace("<TOK>", str(GOLDEN / "tokenizer")))
    if edit is not None:
        edit(params)
    config = out.parent / f"{case}.yaml"
    config.write_text(yaml.safe_dump(params))
    preprocess_config(str(config))
    return out


def _params(name: str, data: Path, tmp_path: Path, model_keys: dict) -> dict:
    """The Release 2.10 file shrunk, its model keys set and both dataloaders BertHDF5DataProcessor on ``data``."""
    params = shrunk(f"src/cerebras/modelzoo/models/nlp/{name}.yaml", data, tmp_path)
    trainer = params["trainer"]
    vocab = json.loads((data / "data_params.json").read_text())["processing"]["vocab_size"]
    trainer["init"]["model"].update({"vocab_size": vocab, **model_keys})
    loader = {"data_processor": "BertHDF5DataProcessor", "data_dir": str(data), "batch_size": 4, "shuffle": False,
              "num_workers": 0}
    trainer["fit"] = {"train_dataloader": dict(loader), "val_dataloader": dict(loader)}
    for key in ("validate", "validate_all"):
        trainer.pop(key, None)
    return params


def _by_hand(model, batch: dict, weight: float) -> float:
    """The vendor's MLM loss over the drawn positions only (padding slots and -100 labels never scored)."""
    gather = batch["labels"].shape[1] != batch["input_ids"].shape[1]
    with torch.no_grad():
        logits, _ = model.model(batch["input_ids"], batch["attention_mask"], None,
                                batch["masked_lm_positions"] if gather else None)
    drawn = batch["masked_lm_mask"].bool() if gather else batch["labels"] != -100
    ce = F.cross_entropy(logits[drawn].float(), batch["labels"][drawn].long(), reduction="sum")
    return (ce / batch["input_ids"].shape[0] * weight).item()


@needs_mirror
@pytest.mark.slow
@pytest.mark.parametrize("case_id, recorded, edit, name, model_keys", CASES, ids=[c[0] for c in CASES])
def test_preprocessed_shards_train(case_id, recorded, edit, name, model_keys, tmp_path):
    import h5py

    data = _preprocess(recorded, edit, tmp_path / "data")
    params = _params(name, data, tmp_path, model_keys)
    section = params["trainer"]["fit"]["train_dataloader"]
    batch = next(iter(bert_data("train", **section)))
    with h5py.File(next(data.glob("*.h5")), "r") as f:  # the processor's first batch: the first rows written
        rows, labels = f["data"][:4], f["labels"][:4]
    np.testing.assert_array_equal(batch["input_ids"].numpy(), rows[:, 0])
    np.testing.assert_array_equal(batch["attention_mask"].numpy(), rows[:, 1])
    np.testing.assert_array_equal(batch["labels"].numpy(), labels[:, 0])
    if labels.shape[1] == 3:
        np.testing.assert_array_equal(batch["masked_lm_positions"].numpy(), labels[:, 1])
        np.testing.assert_array_equal(batch["masked_lm_mask"].numpy(), labels[:, 2])
    assert (labels[:, 0] == -100).any()  # the vendor's ignore_index fills the slots no draw took

    keys = dict(params["trainer"]["init"]["model"])
    torch.manual_seed(0)
    model = build(keys)
    with torch.no_grad():
        loss = model(dict(batch)).item()
    assert loss == pytest.approx(_by_hand(model, batch, keys["mlm_loss_weight"]), rel=1e-5)

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    output, rc = mz._in_process(["train", "--params", str(path), "--device", "CPU", "--resume", "none"])
    assert rc == 0, output
    assert (tmp_path / "model_dir" / "checkpoint_5.mdl").is_file()
    losses = read_scalars(tmp_path / "model_dir" / "train")["loss"]  # the files log every step or the last
    assert losses[-1][0] == 5 and all(math.isfinite(v) for _, v in losses), losses


def test_bert_pretraining_shards_are_refused_by_name(tmp_path):
    """BertHDF5DataProcessor reads masked-LM shards only (the vendor's needs a 'labels' dataset too): the
    bert_pretraining layout is one line naming the file and the fix."""
    data = _preprocess("bert_pretraining", None, tmp_path / "data")
    with pytest.raises(DataError, match=r"output_chunk_0_1\.h5: holds bert_pretraining samples .*training_objective: "
                                        r"mlm") as info:
        bert_data("train", data_processor="BertHDF5DataProcessor", data_dir=str(data), batch_size=2)
    assert "\n" not in str(info.value)
