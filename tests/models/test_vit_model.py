"""vision_transformer's model against hand computations: the vendor's conventions a checkpoint depends on
(the cls token's position row is the table's last, the Linear patch projection's columns are (row, column,
channel)), the DINOv2 classifier and freezing by hand, and its config checks: each bad key one ValueError
naming it (the registry words it as a params error)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cs_run.models.vision_transformer.model import build_model
from cs_run.models.vision_transformer.trunk import patchify

TINY = dict(hidden_size=16, num_hidden_layers=2, num_heads=4, filter_size=32, image_size=[8, 12], patch_size=[4, 4],
            num_classes=3, dropout_rate=0.0, attention_dropout_rate=0.0)


def test_vendor_checkpoint_keys_and_cls_position_row_is_last():
    torch.manual_seed(0)
    model = build_model(**TINY).eval()
    keys = set(model.state_dict())
    for key in ("model.vit_model.embedding_layer.linear_proj.weight", "model.vit_model.embedding_layer.cls_embedding",
                "model.vit_model.embedding_layer.position_embeddings.weight",
                "model.vit_model.encoder.transformer_encoder.layers.1.self_attn.proj_q_dense_layer.weight",
                "model.vit_model.encoder.transformer_encoder.layers.1.ffn.ffn.1.linear_layer.bias",
                "model.vit_model.encoder.transformer_encoder.norm.weight",
                "model.classifier.classifier.ffn.0.linear_layer.weight"):
        assert key in keys, key
    emb = model.model.vit_model.embedding_layer
    images = torch.randn(2, 3, 8, 12)
    with torch.no_grad():
        out = emb(images)
        pos = emb.position_embeddings.weight
        assert pos.shape[0] == 2 * 3 + 1
        torch.testing.assert_close(out[:, 0], (emb.cls_embedding + pos[-1]).expand(2, -1))
        # patch p: a hand flattening (row, column, channel) of the pixels, projected, plus row p
        patch = images[:, :, 4:8, 8:12].permute(0, 2, 3, 1).reshape(2, -1)  # patch 5: second row, third column
        torch.testing.assert_close(out[:, 1 + 5], patch @ emb.linear_proj.weight.T + emb.linear_proj.bias + pos[5])


def test_conv_and_linear_patch_projections_agree_with_the_weights_reordered():
    torch.manual_seed(0)
    conv = build_model(**TINY, use_conv_patchified_embedding=True).eval()
    linear = build_model(**TINY).eval()
    state = conv.state_dict()
    w = state["model.vit_model.embedding_layer.linear_proj.weight"]  # [hidden, c, ph, pw]
    state["model.vit_model.embedding_layer.linear_proj.weight"] = w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)
    linear.load_state_dict(state)
    images = torch.randn(2, 3, 8, 12)
    with torch.no_grad():
        torch.testing.assert_close(linear.model(images), conv.model(images), rtol=1e-5, atol=1e-6)
    assert patchify(images, [4, 4]).shape == (2, 6, 48)


def test_dinov2_classifier_and_freeze_by_hand():
    torch.manual_seed(0)
    model = build_model(**TINY, use_dinov2_classifier=True, freeze=[r"^vit_model\.embedding_layer\."]).eval()
    images = torch.randn(2, 3, 8, 12)
    with torch.no_grad():
        hidden, _ = model.model.vit_model(images)
        head = model.model.classifier.classifier.ffn[0].linear_layer
        by_hand = torch.cat([hidden[:, 0], hidden[:, 1:].mean(1)], 1) @ head.weight.T + head.bias
        torch.testing.assert_close(model.model(images), by_hand)
    frozen = {n for n, p in model.model.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, _ in model.model.named_parameters() if n.startswith("vit_model.embedding_layer.")}
    labels = torch.tensor([0, 2])
    assert model((images, labels)).item() == pytest.approx(F.cross_entropy(model.model(images), labels).item())


def test_defaults_are_the_model_zoo_2_10_ones():
    model = build_model(num_hidden_layers=1)
    c = model.config
    assert (c["hidden_size"], c["num_heads"], c["filter_size"], c["image_size"], c["patch_size"]) == \
        (768, 12, 3072, [224, 224], [16, 16])
    assert (c["dropout_rate"], c["attention_dropout_rate"], c["layer_norm_epsilon"], c["num_classes"]) == \
        (0.1, 0.1, 1e-5, 2)
    assert c["default_initializer"] == {"name": "truncated_normal", "mean": 0.0, "std": 0.02, "a": -0.04, "b": 0.04}
    assert not c["use_conv_patchified_embedding"] and c["prepend_cls_token"] and model.accuracy_metric_cls is not None


@pytest.mark.parametrize("change, message", [
    ({"image_size": [8, 10]}, r"^patch_size: \[4, 4\] does not divide image_size \[8, 10\] \(width\)"),
    ({"image_size": 8}, r"^image_size: expected \[height, width\]"),
    ({"num_heads": 5}, r"^num_heads: 5 does not divide hidden_size 16"),
    ({"nonlinearity": "gelux"}, r"^nonlinearity: unknown 'gelux'"),
    ({"position_embedding_type": "fixed"}, r"^position_embedding_type: 'fixed' is not one of learned, None"),
    ({"interpolate_position_embedding": {"antialias": 1}}, r"^interpolate_position_embedding\.antialias: expected true"),
    ({"interpolate_position_embedding": {"offset": 0.1}}, r"^interpolate_position_embedding\.offset: unknown key"),
    ({"interpolate_position_embedding": {"local_patch_dims": 2}},
     r"^interpolate_position_embedding\.local_patch_dims: expected \[rows, columns\]"),
    ({"interpolate_position_embedding": {}, "position_embedding_type": None},
     r"^interpolate_position_embedding: interpolates a learned table"),
    ({"dropout_rate": 1.5}, r"^dropout_rate: must be in \[0, 1\]"),
    ({"attention_module": "multiquery_attention", "extra_attention_params": {"num_kv_groups": 3}},
     r"^extra_attention_params\.num_kv_groups: .*divisor of num_heads 4"),
    ({"use_dinov2_classifier": True, "prepend_cls_token": False}, r"^use_dinov2_classifier: needs prepend_cls_token"),
    ({"num_classes": 0}, r"^num_classes: must be >= 1"),
    ({"freeze": ["("]}, r"^freeze: '\(' is not a regular expression"),
    ({"ffn_initializer": {"name": "nope"}}, r"^ffn_initializer\.name: unknown initializer 'nope'"),
    ({"image_layer_idx": 2}, r"^image_layer_idx: 2 is not a layer of num_hidden_layers 2"),
])
def test_bad_model_keys_are_one_error_naming_the_key(change, message):
    with pytest.raises(ValueError, match=message) as info:
        build_model(**{**TINY, **change})
    assert "\n" not in str(info.value)
