"""llava (issue 39): the Model Zoo 2.10 llava files, shrunk by tools/modelzoo_files.py, over samples in the
layout of the vendor's llava preprocessing (write_llava_data): validate-only, 5 training steps on CPU and
on CSX fx; the first batch's logits and loss against transformers' LlavaForConditionalGeneration holding
the same weights; the bad model keys, each one error naming the key.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hf_helpers import TOL, build
from modelzoo_file_helpers import in_process_every_step, mz, needs_mirror, shrunk, train_flat_file_3_cpu_steps, train_on_cpu_and_csx, write

from cs_run.data.processors.llava_hdf5 import build_dataloader
from cs_run.errors import ParamsError
from cs_run.models.llava import hf as llava_hf
from tests.modelzoo_marks import first_in_suite_rest_in_sweep

FILES = ["params_llava_v1p5_pretrain_7b_phase1_MSL2K", "params_llava_v1p5_pretrain_7b_phase2_MSL2K",
         "params_llava_v1p5_pretrain_13b_phase1_MSL2K", "params_llava_v1p5_pretrain_13b_phase2_MSL2K"]
pytestmark = needs_mirror


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("llava_shards")
    for start in mz.LLAVA_IMAGE_STARTS:
        mz.write_llava_data(out / "llava" / f"start_{start}", image_start_idx=start)
    return out


def _path(name: str) -> str:
    return f"src/cerebras/modelzoo/models/multimodal/llava/configs/{name}.yaml"


def _shrunk(name: str, data: Path, tmp_path: Path) -> dict:
    return shrunk(_path(name), data, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", first_in_suite_rest_in_sweep(FILES, keep=(FILES[1],)))
def test_file_validates_and_trains_5_steps_on_cpu_and_csx(tmp_path, data, name):
    """Phase 1 (both towers frozen, the image at 1) and phase 2 (the text model trains, the image at 35) in
    make test; the 13b files differ from the 7b ones only in sizes (make test-sweep)."""
    path = write(in_process_every_step(_shrunk(name, data, tmp_path)), tmp_path / "p.yaml")
    cpu, csx = train_on_cpu_and_csx(path, tmp_path)
    assert [s for s, _ in cpu] == [1, 2, 3, 4, 5] == [s for s, _ in csx]
    assert all(np.isfinite(loss) for _, loss in cpu)
    # the fx tier runs the traced step's own aten calls in eager's order (bf16 autocast on both): the same floats
    assert cpu == csx


def _model_and_batch(name: str, data: Path, tmp_path: Path):
    params = _shrunk(name, data, tmp_path)
    keys = dict(params["trainer"]["init"]["model"])
    torch.manual_seed(0)
    model = build(keys)
    section = dict(params["trainer"]["fit"]["train_dataloader"])
    for drop in ("data_processor", "num_workers", "prefetch_factor", "persistent_workers"):
        section.pop(drop)
    loader = build_dataloader("train", **section, image_model=keys["image_model"], text_model=keys["text_model"])
    return model, keys, next(iter(loader))


def _transformers_llava(model, keys: dict):
    transformers = pytest.importorskip("transformers")
    config = llava_hf.hf_config(keys)
    hf = transformers.LlavaForConditionalGeneration(transformers.LlavaConfig(**{
        **config, "vision_config": {k: v for k, v in config["vision_config"].items() if k != "model_type"},
        "text_config": config["text_config"]})).eval()
    hf.load_state_dict(llava_hf.to_hf_state_dict(model, legacy=False))  # strict: every tensor, once
    return hf, config


def _hf_logits(hf, config: dict, batch: dict, start: int, patches: int) -> torch.Tensor:
    ids = batch["text_input_ids"].long().clone()
    ids[:, start:start + patches] = hf.config.image_token_id  # HF splices at its image token
    with torch.no_grad():
        return hf(input_ids=ids, pixel_values=batch["image_data"], attention_mask=1 - batch["key_padding_mask"]).logits


@pytest.mark.parametrize("name, start", [(FILES[0], 1), (FILES[1], 35)])
def test_first_loss_is_transformers_llava_with_the_same_weights(tmp_path, data, name, start):
    """The file's first batch (a text-only sample among them: its image keys padded out) through the model and
    through LlavaForConditionalGeneration holding the same weights: logits within 1e-5, and the loss is the
    masked mean of the label tokens' cross entropy of HF's logits (loss_scaling num_tokens)."""
    model, keys, batch = _model_and_batch(name, data, tmp_path)
    assert keys["image_start_idx"] == start  # phase 2's: the vendor's system prompt comes before the image
    assert (batch["key_padding_mask"][:, start:start + 4] == 1).any(), "a text-only sample in the batch"
    hf, config = _transformers_llava(model, keys)
    hf_logits = _hf_logits(hf, config, batch, start, 4)
    with torch.no_grad():
        logits = model.logits(batch)
        loss = model(batch)
    torch.testing.assert_close(logits, hf_logits, **TOL)
    mask = batch["loss_mask"].float()
    token = F.cross_entropy(hf_logits.reshape(-1, hf_logits.shape[-1]), batch["labels"].reshape(-1).long(),
                            reduction="none")
    torch.testing.assert_close(loss, (token * mask.reshape(-1)).sum() / mask.sum(), **TOL)


def test_image_features_replace_the_placeholders_and_padded_keys_are_not_attended(tmp_path, data):
    """By hand: the logits change with the image where the sample has one, and a text-only sample's logits do
    not depend on its (padded-out) image positions' features."""
    model, keys, batch = _model_and_batch(FILES[0], data, tmp_path)
    other = dict(batch, image_data=torch.randn_like(batch["image_data"]))
    with torch.no_grad():
        a, b = model.logits(batch), model.logits(other)
    no_image = batch["key_padding_mask"][:, 1].bool()
    assert no_image.any() and (~no_image).any()
    # text-only rows: every position after the image's reads the same keys (its features are padded out)
    torch.testing.assert_close(a[no_image][:, 5:], b[no_image][:, 5:], rtol=0, atol=1e-6)
    assert not torch.allclose(a[~no_image][:, 5:], b[~no_image][:, 5:])
    assert torch.equal(a[:, 0], b[:, 0])  # bos comes before the image: causal


_BASE_IMAGE = {"name": "ViTModel", "hidden_size": 16, "num_hidden_layers": 2, "num_heads": 2, "filter_size": 32,
               "image_size": [28, 28], "patch_size": [14, 14]}
_BASE_TEXT = {"name": "LlamaModel", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_heads": 2,
              "filter_size": 64, "max_position_embeddings": 16, "position_embedding_type": "rotary",
              "rotary_dim": 16, "norm_type": "rmsnorm", "nonlinearity": "swiglu"}
_BASE_PROJ = {"image_model": {"name": "FeedForwardNetwork", "input_unit": 16, "layers_units": [32, 32],
                              "layers_activation": ["gelu", None]}}


@pytest.mark.parametrize("change, message", [
    ({"image_model": {**_BASE_IMAGE, "name": "ViT"}}, "image_model.name: 'ViT'; llava builds ViTModel"),
    ({"text_model": {**_BASE_TEXT, "hidden_sise": 3}}, "model.text_model.hidden_sise"),
    ({"image_model": {**_BASE_IMAGE, "num_heads": "two"}}, "model.image_model.num_heads"),
    ({"projector": {"image_model": {**_BASE_PROJ["image_model"], "layers_units": [32, 48]}}},
     "projector.image_model.layers_units[-1]: 48 but text_model.hidden_size is 32"),
    ({"projector": {"image_model": {**_BASE_PROJ["image_model"], "input_unit": 8}}},
     "projector.image_model.input_unit: 8 but image_model.hidden_size is 16"),
    ({"projector": None}, "projector: none, and image_model.hidden_size: 16"),
    ({"image_feature_select_layer_idx": 2}, "image_feature_select_layer_idx: 2 is not a layer"),
    ({"freeze": ["^vision_model"]}, "freeze[0]: '^vision_model' matches no module"),
    ({"text_model": {**_BASE_TEXT, "embd_pdrop": 0.1, "embedding_dropout_rate": 0.0}}, "text_model.embd_pdrop"),
    ({"moe": {"num_experts": 2}}, "moe: a mixture-of-experts text model"),
])
def test_bad_model_keys_name_the_key(change, message):
    keys = {"name": "llava", "image_model": _BASE_IMAGE, "text_model": _BASE_TEXT, "projector": _BASE_PROJ, **change}
    with pytest.raises((ValueError, ParamsError), match=None) as e:
        build(keys)
    assert message in str(e.value)


def _tiny_llava_and_batch():
    """The tiny llava of the bad-key table (4 image patches at 1, a 16-token rotary Llama) and one sample of two
    documents, as Release 2.2's six-row samples pack them: bos, image, 5 tokens | 4 tokens | 2 pads."""
    torch.manual_seed(0)
    model = build({"name": "llava", "image_model": _BASE_IMAGE, "text_model": _BASE_TEXT, "projector": _BASE_PROJ,
                   "image_start_idx": 1})
    ids = torch.randint(3, 64, (1, 16), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    ends = (10, 14)  # documents [0, 10) and [10, 14), then padding
    span = torch.tensor([[9 - k for k in range(10)] + [13 - k for k in range(10, 14)] + [0, 0]], dtype=torch.int32)
    positions = torch.tensor([list(range(10)) + list(range(4)) + [0, 0]], dtype=torch.int32)
    padding = torch.zeros(1, 16, dtype=torch.int32)
    padding[:, ends[1]:] = 1
    batch = {"image_data": torch.randn(1, 3, 28, 28, generator=torch.Generator().manual_seed(2)),
             "text_input_ids": ids, "labels": ids.roll(-1, 1), "loss_mask": 1 - padding, "key_padding_mask": padding,
             "attention_span": span, "position_ids": positions}
    return model, batch


def test_release_2_2_attention_span_keeps_each_document_to_itself_by_hand():
    """Release 2.2's rows: a query sees key k when 0 <= q - k <= attention_span[k], so the second document's
    logits do not depend on the first's tokens or image (they do under the plain causal mask); spans that
    reach one sample's end, as the writer of one sample per row gives, are the causal mask itself."""
    model, batch = _tiny_llava_and_batch()
    other = dict(batch, image_data=torch.randn_like(batch["image_data"]))
    other["text_input_ids"] = batch["text_input_ids"].clone()
    other["text_input_ids"][:, 5:10] = (other["text_input_ids"][:, 5:10] + 7) % 61 + 3
    causal = {k: v for k, v in batch.items() if k not in ("attention_span", "position_ids")}
    causal_other = {k: v for k, v in other.items() if k not in ("attention_span", "position_ids")}
    with torch.no_grad():
        a, b = model.logits(batch), model.logits(other)
        c, d = model.logits(causal), model.logits(causal_other)
        one = dict(batch, attention_span=torch.tensor([[13 - k for k in range(14)] + [0, 0]], dtype=torch.int32))
        e = model.logits(one)
    torch.testing.assert_close(a[:, 10:14], b[:, 10:14], rtol=0, atol=0)
    assert not torch.allclose(c[:, 10:14], d[:, 10:14]) and not torch.allclose(a[:, 10:14], c[:, 10:14])
    torch.testing.assert_close(e[:, :14], c[:, :14], rtol=0, atol=1e-6)


def test_release_2_2_trailing_padding_under_bfloat16_is_not_nan():
    """A trailing pad query's only VSL key is itself, and padded: left seen, it keeps bfloat16's softmax finite
    (an all-masked row was NaN and so was the loss, 0 * NaN)."""
    model, batch = _tiny_llava_and_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(batch)
    assert torch.isfinite(loss)


@pytest.mark.slow
def test_release_2_2_files_validate_and_train_3_cpu_steps(tmp_path):
    """The 2.2.0 files refused before (train_input.bos_token_id): their six-row samples (write_llava_data
    six_rows), validate-only and 3 CPU steps; phase 1 (the image at 1) and phase 2 (at 35)."""
    mz.write_llava_data(tmp_path / "d" / "llava" / "start_1" / mz.LLAVA_2_2_FOLDER, six_rows=True, rows=8)
    mz.write_llava_data(tmp_path / "d" / "llava" / "start_35" / mz.LLAVA_2_2_FOLDER, six_rows=True, rows=8,
                        image_start_idx=35)
    for name in FILES[:2]:
        params = shrunk(_path(name), tmp_path / "d", tmp_path / name, "Release_2.2.0")
        assert params["train_input"]["bos_token_id"] == 1 and mz.LLAVA_2_2_FOLDER in params["train_input"]["data_dir"]
        losses = train_flat_file_3_cpu_steps(params, tmp_path / f"{name}.yaml", tmp_path / name)
        assert [s for s, _ in losses] == [1, 2, 3] and all(np.isfinite(v) for _, v in losses)
