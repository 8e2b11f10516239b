"""multimodal_simple (issue 39): the Model Zoo 2.10 multimodal_simple files, shrunk by tools/modelzoo_files.py,
over samples in the layout of the vendor's multimodal preprocessing (write_multimodal_simple_data):
validate-only, 5 training steps on CPU and on CSX fx; the first batch's logits and loss against transformers'
LlavaForConditionalGeneration holding the same weights (the files' one encoder and global projection are
LLaVA's tower and projector); two encoders and two images per sample against the features placed by hand; the
bad model keys, each one error naming the key.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hf_helpers import TOL, build
from modelzoo_file_helpers import in_process_every_step, mz, needs_mirror, shrunk, train_on_cpu_and_csx, write

from cs_run.data.processors.multimodal_simple_hdf5 import build_dataloader
from cs_run.errors import ParamsError
from cs_run.models.llava import hf as llava_hf
from tests.modelzoo_marks import first_in_suite_rest_in_sweep

FILES = ["params_mm_llava_llama2_7b_phase1", "params_mm_llava_llama2_7b_phase2"]
PATCHES = 4  # 28-pixel images of 14-pixel patches (mz.LLAVA_IMAGE_SIZES)
pytestmark = needs_mirror


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mmsimple_shards")
    mz.write_multimodal_simple_data(out / "multimodal_simple")
    return out


def _shrunk(name: str, data: Path, tmp_path: Path) -> dict:
    return shrunk(f"src/cerebras/modelzoo/models/multimodal/multimodal_simple/configs/{name}.yaml", data, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", first_in_suite_rest_in_sweep(FILES))
def test_file_validates_and_trains_5_steps_on_cpu_and_csx(tmp_path, data, name):
    """Phase 1 in make test; phase 2 differs only in its data paths and batch size (make test-sweep)."""
    path = write(in_process_every_step(_shrunk(name, data, tmp_path)), tmp_path / "p.yaml")
    cpu, csx = train_on_cpu_and_csx(path, tmp_path)
    assert [s for s, _ in cpu] == [1, 2, 3, 4, 5] == [s for s, _ in csx]
    assert all(np.isfinite(loss) for _, loss in cpu)
    assert cpu == csx  # the fx tier runs the traced step's own aten calls in eager's order


def _model_and_batch(data: Path, tmp_path: Path):
    params = _shrunk(FILES[0], data, tmp_path)
    keys = dict(params["trainer"]["init"]["model"])
    torch.manual_seed(0)
    model = build(keys)
    section = dict(params["trainer"]["fit"]["train_dataloader"])
    for drop in ("data_processor", "num_workers", "prefetch_factor", "persistent_workers"):
        section.pop(drop)
    loader = build_dataloader("train", **{**section, "shuffle": False}, text_model=keys["text_model"])
    return model, keys, next(iter(loader))


def _as_llava(model, keys: dict):
    """The same weights as a cs-run llava model (one encoder, its features at block image_layer_idx, the global
    projection as llava's projector), then as transformers' LlavaForConditionalGeneration."""
    transformers = pytest.importorskip("transformers")
    (entry,) = keys["image_model_list"]["image_models"]
    encoder = {k: v for k, v in entry["image_encoder"].items() if k != "image_layer_idx"}
    llava_keys = {"image_model": encoder, "text_model": keys["text_model"],
                  "projector": {"image_model": keys["image_model_list"]["global_image_projection"]},
                  "image_feature_select_layer_idx": entry["image_encoder"]["image_layer_idx"],
                  "image_feature_select_mode": keys["image_model_list"]["image_feature_select_mode"]}
    text = dict(llava_keys["text_model"])
    text.pop("extra_ffn_params")  # static_dual_expert: false
    llava_keys["text_model"] = text
    llava = build({"name": "llava", **llava_keys})
    renamed = {k.replace("model.image_model.image_model_list.0.0.", "model.image_model.")
               .replace("model.image_model.projection.", "model.projector_image_model."): v
               for k, v in model.state_dict().items()}
    llava.load_state_dict(renamed)  # strict: every tensor, once
    config = llava_hf.hf_config(llava_keys)
    hf = transformers.LlavaForConditionalGeneration(transformers.LlavaConfig(**{
        **config, "vision_config": {k: v for k, v in config["vision_config"].items() if k != "model_type"},
        "text_config": config["text_config"]})).eval()
    hf.load_state_dict(llava_hf.to_hf_state_dict(llava, legacy=False))
    return hf


def test_first_loss_is_transformers_llava_with_the_same_weights(tmp_path, data):
    """The phase 1 file's first batch (samples with and without an image) through the model and, a sample at a
    time, through LlavaForConditionalGeneration holding the same weights (image tokens where img_data_loc
    places the features): logits within 1e-5, and the loss is the masked mean of the label tokens' cross
    entropy of HF's logits (loss_scaling num_tokens)."""
    model, keys, batch = _model_and_batch(data, tmp_path)
    hf = _as_llava(model, keys)
    seq = batch["text_input_ids"].shape[1]
    has_image = batch["image_data_loc"][:, 0, 0] < seq
    assert has_image.any() and (~has_image).any()
    rows = []
    for b in range(len(has_image)):
        ids = batch["text_input_ids"][b:b + 1].long().clone()
        extra = {}
        if has_image[b]:
            ids[0, batch["image_data_loc"][b, 0].long()] = hf.config.image_token_id
            extra["pixel_values"] = batch["image_data"][b]
        with torch.no_grad():
            rows.append(hf(input_ids=ids, attention_mask=1 - batch["key_padding_mask"][b:b + 1], **extra).logits)
    hf_logits = torch.cat(rows)
    with torch.no_grad():
        logits, loss = model.logits(batch), model(batch)
    torch.testing.assert_close(logits, hf_logits, **TOL)
    mask = batch["loss_mask"].float()
    token = F.cross_entropy(hf_logits.reshape(-1, hf_logits.shape[-1]), batch["labels"].reshape(-1).long(),
                            reduction="none")
    torch.testing.assert_close(loss, (token * mask.reshape(-1)).sum() / mask.sum(), **TOL)


_IMAGE = {"name": "ViTModel", "hidden_size": 16, "num_hidden_layers": 2, "num_heads": 2, "filter_size": 32,
          "image_size": [28, 28], "patch_size": [14, 14], "prepend_cls_token": True}
_TEXT = {"name": "LlamaModel", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_heads": 2,
         "filter_size": 64, "max_position_embeddings": 32, "position_embedding_type": "rotary", "rotary_dim": 16,
         "norm_type": "rmsnorm", "nonlinearity": "swiglu"}
_PROJ = {"name": "FeedForwardNetwork", "input_unit": 16, "layers_units": [32], "use_bias": True}


def _two_encoders() -> dict:
    return {"name": "multimodal_simple", "text_model": _TEXT, "image_model_list": {
        "image_models": [{"image_encoder": {**_IMAGE, "image_layer_idx": 0}, "projection_layer": _PROJ},
                         {"image_encoder": {**_IMAGE, "hidden_size": 8}, "projection_layer": {**_PROJ, "input_unit": 8}}],
        "global_image_projection": {**_PROJ, "input_unit": 32, "layers_units": [32, 32],
                                    "layers_activation": ["gelu", None]}}}


def test_two_encoders_and_two_images_are_placed_where_img_data_loc_says(tmp_path):
    """By hand: each encoder's patch features (block image_layer_idx; the second's every block and its final
    norm) through its projection, concatenated (4 + 4 per image), through the global projection, written at
    img_data_loc's positions of the text embeddings; an unused slot (the sequence length) writes nothing."""
    torch.manual_seed(0)
    model = build(_two_encoders())
    mm = model.model
    seq, b = 24, 2
    images = torch.randn(b, 2, 3, 28, 28)
    loc = torch.full((b, 2, 2 * PATCHES), seq)
    loc[0, 0], loc[0, 1], loc[1, 0] = torch.arange(1, 9), torch.arange(12, 20), torch.arange(3, 11)
    ids = torch.randint(0, 64, (b, seq))
    with torch.no_grad():
        got = mm.compute_input_embeddings(images, ids, loc)
        expected = mm.text_model.input_embeddings(ids).clone()
        for s in range(b):
            for i in range(2):
                feats = []
                for (vit, proj), idx in zip(mm.image_model.image_model_list, (0, None)):
                    h = vit.embedding_layer(images[s, i:i + 1])
                    h = vit.encoder(h, idx)[0] if idx is not None else vit.encoder(h)[0]
                    feats.append(proj(h[:, 1:]))
                f = mm.image_model.projection(torch.cat(feats, dim=1))[0]
                if loc[s, i, 0] < seq:
                    expected[s, loc[s, i]] = f
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    batch = {"image_data": images, "image_data_loc": loc, "text_input_ids": ids, "labels": ids,
             "loss_mask": torch.ones(b, seq), "key_padding_mask": torch.zeros(b, seq, dtype=torch.int32)}
    other = dict(batch, image_data=batch["image_data"].clone())
    other["image_data"][1, 1] = torch.randn(3, 28, 28)  # sample 1's unused slot: the logits do not move
    with torch.no_grad():
        torch.testing.assert_close(model.logits(batch), model.logits(other), rtol=0, atol=0)


@pytest.mark.parametrize("change, message", [
    ({"text_model": {**_TEXT, "name": "T5ForConditionalGeneration"}},
     "text_model.name: 'T5ForConditionalGeneration'; multimodal_simple builds LlamaModel"),
    ({"text_model": {**_TEXT, "hidden_sise": 3}}, "model.text_model.hidden_sise"),
    ({"text_model": {**_TEXT, "extra_ffn_params": {"static_dual_expert": True}}},
     "text_model.extra_ffn_params.static_dual_expert: true"),
    ({"image_model_list": {"image_models": [{"image_encoder": {**_IMAGE, "name": "ViT"}}]}},
     "image_model_list.image_models[0].image_encoder.name: 'ViT'"),
    ({"image_model_list": {"image_models": [{"image_encoder": {**_IMAGE, "num_heads": "two"}}]}},
     "model.image_model_list.image_models[0].image_encoder.num_heads"),
    ({"image_model_list": {"image_models": [{"image_encoder": _IMAGE, "projector": _PROJ}]}},
     "image_model_list.image_models[0]: expected {image_encoder"),
    ({"image_model_list": {"image_models": []}}, "image_model_list.image_models: expected a list"),
    ({"image_model_list": {"image_models": [{"image_encoder": _IMAGE}], "global_projection": _PROJ}},
     "image_model_list.global_projection: unknown key"),
    ({"image_model_list": {"image_models": [{"image_encoder": _IMAGE}]}},
     "image_model_list: the image features are 16 wide but text_model.hidden_size is 32"),
    ({"image_model_list": {"image_models": [{"image_encoder": _IMAGE, "projection_layer": {**_PROJ, "input_unit": 8}}]}},
     "image_model_list.image_models[0].projection_layer.input_unit: 8 but its image_encoder.hidden_size is 16"),
    ({"image_model_list": {"image_models": [{"image_encoder": _IMAGE, "projection_layer": _PROJ},
                                            {"image_encoder": _IMAGE}]}},
     "their widths differ ([32, 16])"),
    ({"image_model_list": {"image_models": [{"image_encoder": _IMAGE, "projection_layer": _PROJ},
                                            {"image_encoder": {**_IMAGE, "image_size": [56, 56]},
                                             "projection_layer": _PROJ}]}}, "their num_channels, image_size differ"),
    ({"image_model_list": {"image_models": [{"image_encoder": _IMAGE}],
                           "global_image_projection": {**_PROJ, "layers_units": [32], "layers_activation": ["gelu", None]}}},
     "image_model_list.global_image_projection.layers_activation"),
    ({"image_model_list": {"image_models": [{"image_encoder": {**_IMAGE, "prepend_cls_token": False},
                                             "projection_layer": _PROJ}]}}, "prepend_cls_token: false"),
    ({"image_model_list": {"image_feature_select_mode": "cls"}}, "image_feature_select_mode: 'cls'"),
    ({"freeze": ["^vision_model"]}, "freeze[0]: '^vision_model' matches no module"),
])
def test_bad_model_keys_name_the_key(change, message):
    keys = {**_two_encoders(), **change}
    if "image_feature_select_mode" in change.get("image_model_list", {}):
        keys["image_model_list"] = {**_two_encoders()["image_model_list"], **change["image_model_list"]}
    with pytest.raises((ValueError, ParamsError)) as e:
        build(keys)
    assert message in str(e.value)


def test_projections_start_as_the_vendors_feed_forward_network_not_llavas_projector():
    """The vendor builds multimodal_simple's projections from FeedForwardNetworkConfig as written (xavier_uniform
    weights: bound sqrt(6 / (fan_in + fan_out)) = 0.306 for 32 x 32; zero biases), not llava's kaiming_uniform(a =
    sqrt(5)) override (bound 1 / sqrt(32) = 0.177); output_layer_initializer sets the last layer's."""
    keys = _two_encoders()
    keys["image_model_list"]["global_image_projection"]["output_layer_initializer"] = {"name": "constant", "val": 0.5}
    torch.manual_seed(0)
    projection = build(keys).model.image_model.projection
    first, last = projection.ffn[0].linear_layer, projection.ffn[1].linear_layer
    bound = (6 / 64) ** 0.5
    assert 0.9 * bound < first.weight.abs().max() <= bound
    assert torch.equal(first.bias, torch.zeros(32)) and torch.equal(last.weight, torch.full((32, 32), 0.5))
