"""esm2 (the Model Zoo's ESM-2): token dropout by hand (esm2_model.py's rule), ESM-2's config checks as a table,
and Hugging Face both ways: a tiny random EsmForMaskedLM converted with ``checkpoint convert --from hf`` gives
transformers' logits within 1e-5 and, with the loss weight that makes the vendor's sum / batch a mean,
transformers' loss within 1e-5; ``--to hf`` writes the folder's tensors back bit for bit; a model HF cannot
express is refused naming the key. The Release 2.10 files, shrunk by tools/modelzoo_files.py: the first loss
against transformers, validate-only and 5 steps on CPU and CSX fx; BertCSVDataProcessor, their validation data."""

from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner
from hf_helpers import TOL, build, tiny_hf, to_hf_is_refused
from modelzoo_file_helpers import mz, needs_mirror, run_file, shrunk

from cs_run.checkpoint import load
from cs_run.data.processors.bert import build_dataloader as bert_data
from cs_run.data.processors.bert_csv import build_dataloader as csv_data
from cs_run.errors import DataError
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli
from cs_run.models.common.masks import encoder_vsl_mask
from cs_run.models.esm2.hf import hf_config, to_hf_state_dict
from tests.modelzoo_marks import first_in_suite_rest_in_sweep

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
    output = to_hf_is_refused(tmp_path, {**KEYS, **change})
    line = [x for x in output.splitlines() if x.startswith("Error:")]
    assert len(line) == 1 and f"model.{key}" in line[0], output  # one line, naming the key


# ---------------------------------------------------------------- the Model Zoo 2.10 files (tools/modelzoo_files.py)

FILES = ["params_esm2_t12_35M_UR50D", "params_esm2_t33_650M_UR50D", "params_esm2_t33_650M_UR50D_vsl",
         "params_esm2_t36_3B_UR50D", "params_esm2_t48_15B_UR50D"]


def _path(name: str) -> str:
    return f"src/cerebras/modelzoo/models/nlp/esm2/configs/{name}.yaml"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("esm2_data")
    mz.write_esm2_data(out)
    return out


@needs_mirror
def test_first_loss_of_the_35m_file_is_the_vendor_loss_of_transformers_logits(tmp_path, data):
    """The shrunk params_esm2_t12_35M_UR50D (token dropout, rotary, pre-norm, tied MLM head) on its first batch
    of BertHDF5DataProcessor shards: logits within 1e-5 of EsmForMaskedLM with the same weights, and the
    vendor's loss (masked cross entropy summed / batch * mlm_loss_weight) by hand from them."""
    transformers = pytest.importorskip("transformers")
    trainer = shrunk(_path(FILES[0]), data, tmp_path)["trainer"]
    keys = dict(trainer["init"]["model"])
    section = {**trainer["fit"]["train_dataloader"], "num_workers": 0}
    torch.manual_seed(1)
    model = build(keys)
    batch = next(iter(bert_data("train", **section)))
    assert (batch["input_ids"] == keys["mask_token_id"]).any()  # token dropout has work to do
    with torch.no_grad():
        ours = model(dict(batch)).item()
        our_logits, _ = model.model(batch["input_ids"], batch["attention_mask"], None, batch["masked_lm_positions"])
    config = hf_config(model.config)
    hf = transformers.EsmForMaskedLM(transformers.EsmConfig(**config)).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model), strict=False)
    assert not unexpected and sorted(missing) == ["esm.rotary_embeddings.inv_freq", "lm_head.decoder.weight"]  # a buffer, the tied copy
    hf.tie_weights()
    with torch.no_grad():
        logits = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    gathered = torch.gather(logits, 1, batch["masked_lm_positions"].long()[..., None].expand(-1, -1, logits.shape[-1]))
    torch.testing.assert_close(our_logits, gathered, rtol=1e-5, atol=1e-5)
    ce = F.cross_entropy(gathered.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1).long(), reduction="none")
    expected = (ce * batch["masked_lm_mask"].reshape(-1)).sum() / batch["input_ids"].shape[0] * keys["mlm_loss_weight"]
    assert ours == pytest.approx(expected.item(), rel=1e-5)


@needs_mirror
@pytest.mark.slow
@pytest.mark.parametrize("command, device", [("validate-only", "CPU"), ("train", "CPU"), ("train", "CSX")])
@pytest.mark.parametrize("name", first_in_suite_rest_in_sweep(FILES, keep=["params_esm2_t33_650M_UR50D_vsl"]))
def test_the_five_files_validate_and_train_five_steps(tmp_path, data, name, command, device):
    result = run_file(_path(name), data, tmp_path, command, device)
    assert result["first_error"] == "ok", (name, result)
    if command == "train":
        assert (Path(result["params"]).parent / "model_dir" / "checkpoint_5.mdl").is_file(), name  # 5 steps


# ---------------------------------------------------------------- use_vsl: packed sequences attend to themselves

def test_encoder_vsl_mask_is_the_vendors_bidirectional_example():
    """create_vsl_mask's docstring (is_causal=False): sequences of 3 and 2 tokens, block diagonal."""
    span, pos = torch.tensor([[2, 1, 0, 1, 0]]), torch.tensor([[0, 1, 2, 0, 1]])
    blocks = torch.zeros(5, 5, dtype=torch.bool)
    blocks[:3, :3] = blocks[3:, 3:] = True
    assert torch.equal(encoder_vsl_mask(span, pos, torch.float32)[0, 0] == 0, blocks)


def test_packed_sequences_give_each_sequence_alone():
    """Two sequences packed in one row with their VSL rows give each one's logits alone within 1e-5 (RoPE is
    relative, so the vendor's unrestarted positions change nothing); the padded row's loss mask is unchanged."""
    model = build({**KEYS, "token_dropout": False})
    g = torch.Generator().manual_seed(3)
    a, b = torch.randint(4, 24, (1, 7), generator=g), torch.randint(4, 24, (1, 4), generator=g)
    packed = torch.cat([a, b, torch.full((1, 1), PAD)], dim=1)
    span = torch.tensor([[6, 5, 4, 3, 2, 1, 0, 3, 2, 1, 0, 0]])
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 0]])
    keep = (torch.arange(12) < 11).int()[None]
    with torch.no_grad():
        ours, _ = model.model(packed, keep, None, None, span, pos)
        alone_a, _ = model.model(a, torch.ones_like(a))
        alone_b, _ = model.model(b, torch.ones_like(b))
        mixed, _ = model.model(packed, keep)  # without the VSL rows the two attend to each other
    torch.testing.assert_close(ours[:, :7], alone_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[:, 7:11], alone_b, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(mixed[:, :7], alone_a, atol=1e-3)


def test_bert_hdf5_use_vsl_reads_the_span_and_position_rows(data):
    batch = next(iter(bert_data("train", data_processor="BertHDF5DataProcessor", data_dir=str(data / "train"),
                                batch_size=4, shuffle=False, use_vsl=True)))
    for row in range(4):  # rows 0 and 2 hold two packed sequences: each position's offset and tokens after
        length = int(batch["attention_mask"][row].sum())
        pos, span = batch["position_ids"][row, :length].tolist(), batch["attention_span"][row, :length].tolist()
        starts = [i for i, p in enumerate(pos) if p == 0]
        assert len(starts) == (2 if row % 2 == 0 else 1)
        for i in range(length):
            end = next((s for s in starts if s > i), length)
            assert pos[i] == i - max(s for s in starts if s <= i) and span[i] == end - 1 - i
        assert batch["input_ids"][row, starts].tolist() == [0] * len(starts)  # each begins with <cls>


# ---------------------------------------------------------------- BertCSVDataProcessor (the files' validation data)

def test_bert_csv_processor_reads_the_rows_written(data):
    """The val/ CSV written by tools/modelzoo_files.py read back in order, batch by batch, masked_lm_weights as
    masked_lm_mask; the same rows as the HDF5 shards of the same folder."""
    rows = list(csv.DictReader(open(data / "val" / "part_0.csv", newline="")))
    batches = list(csv_data("val", data_dir=str(data / "val"), batch_size=4, disable_nsp=True))
    assert len(batches) == len(rows) // 4
    for i, batch in enumerate(batches):
        assert set(batch) == {"input_ids", "attention_mask", "labels", "masked_lm_positions", "masked_lm_mask"}
        for j in range(4):
            row = rows[4 * i + j]
            for column in ("input_ids", "attention_mask", "labels", "masked_lm_positions"):
                assert batch[column][j].tolist() == ast.literal_eval(row[column]), (i, j, column)
            assert batch["masked_lm_mask"][j].tolist() == ast.literal_eval(row["masked_lm_weights"])
    h5 = next(iter(bert_data("val", data_processor="BertHDF5DataProcessor", data_dir=str(data / "val"),
                             batch_size=4, shuffle=False)))
    for key in batches[0]:
        assert torch.equal(h5[key], batches[0][key]), key
    shuffled = list(csv_data("val", data_dir=str(data / "val"), batch_size=4, disable_nsp=True, shuffle=True,
                             shuffle_seed=3))
    order = [b["input_ids"] for b in shuffled]
    assert sorted(map(str, torch.cat(order).tolist())) == sorted(map(str, torch.cat([b["input_ids"] for b in
                                                                                      batches]).tolist()))
    assert not torch.equal(torch.cat(order), torch.cat([b["input_ids"] for b in batches]))


def _bad_csv(folder: Path, header: str, row: str, meta: str = "part_0.csv 1") -> None:
    folder.mkdir()
    (folder / "part_0.csv").write_text(f"{header}\n{row}\n")
    (folder / "meta.dat").write_text(meta + "\n")


_GOOD_ROW = '"[0, 5, 2]","[1, 1, 1]","[5]"'


@pytest.mark.parametrize("header, row, meta, message", [
    ("input_ids,attention_mask", '"[0, 5, 2]","[1, 1, 1]"', "part_0.csv 1", r"part_0\.csv:2: no 'labels' column"),
    ("input_ids,attention_mask,labels", '"[0, 5, 2]","[1, x, 1]","[5]"', "part_0.csv 1",
     r"part_0\.csv:2: column 'attention_mask' is not a list of integers"),
    ("input_ids,attention_mask,labels", _GOOD_ROW, "part_0.csv", r"meta\.dat:1: expected '<csv file> <number of rows>'"),
    ("input_ids,attention_mask,labels", _GOOD_ROW, "missing.csv 1", r"missing\.csv: cannot read"),
    ("input_ids,attention_mask,labels", _GOOD_ROW, "part_0.csv 0", r"0 rows in meta\.dat, fewer than one batch"),
])
def test_bert_csv_processor_bad_inputs_name_the_file(tmp_path, header, row, meta, message):
    _bad_csv(tmp_path / "d", header, row, meta)
    with pytest.raises(DataError, match=message):
        list(csv_data("val", data_dir=str(tmp_path / "d"), batch_size=1, disable_nsp=True))
