"""dino (the Model Zoo 2.10 DINOv2 model) against independent references: the trunk's hidden states against
transformers' Dinov2Model with the same weights (the teacher's unmasked global views and the student's masked
ones), the interpolated positions against F.interpolate of the position grid (DINOv2's rule), the head's
weight-normalised layer against torch's weight_norm, the first loss against the DINO + iBOT rule written out
here, the teacher's EMA by hand, and the bad ``model:`` keys as one error naming the key. The model is the tiny
copy of params_dinov2_large_patch14_img224.yaml (tools/modelzoo_files.py's sizes)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner
from modelzoo_file_helpers import mz, needs_mirror, shrunk

from cs_run.data.processors.dino_image import build_dataloader
from cs_run.frontends.cli import cli
from cs_run.models.dino.config import TempLossConfig
from cs_run.models.dino.heads import WeightNormLinear
from cs_run.models.dino.losses import KoLeoLoss, teacher_temperature
from cs_run.models.dino.model import build_model
from cs_run.models.vision_transformer.config import ViTModelConfig
from cs_run.models.vision_transformer.trunk import ViTEmbeddingLayer

CONFIGS = "src/cerebras/modelzoo/models/vision/dino/configs/"
pytestmark = needs_mirror


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    pytest.importorskip("PIL.Image")
    root = tmp_path_factory.mktemp("imagenet")
    mz.write_images(root)
    return root


def tiny(name: str, images: Path, tmp_path: Path) -> dict:
    """The vendor file with only sizes, batch, steps and data paths changed (tools/modelzoo_files.py)."""
    return shrunk(f"{CONFIGS}{name}.yaml", images, tmp_path)


def _model_keys(params: dict, **trunk) -> dict:
    keys = copy.deepcopy({k: v for k, v in params["trainer"]["init"]["model"].items() if k != "name"})
    for t in keys["image_model_trunks"]:
        t["image_model"].update(trunk)
    return keys


def _batch(params: dict) -> dict:
    section = dict(params["trainer"]["fit"]["train_dataloader"], num_workers=0)
    section.pop("prefetch_factor")
    return next(iter(build_dataloader("train", **section)))


def _dinov2(trunk, cfg: dict):
    """transformers' Dinov2Model holding ``trunk``'s weights (zero biases where the file has none)."""
    transformers = pytest.importorskip("transformers")
    h, p = cfg["hidden_size"], cfg["patch_size"][0]
    hf = transformers.Dinov2Model(transformers.Dinov2Config(
        hidden_size=h, num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_heads"],
        mlp_ratio=cfg["filter_size"] // h, image_size=cfg["image_size"][0], patch_size=p, layer_norm_eps=1e-6,
        qkv_bias=cfg["use_projection_bias_in_attention"], layerscale_value=1.0, hidden_act="gelu",
        drop_path_rate=0.0)).eval()
    sd = trunk.state_dict()
    emb = "embedding_layer."
    table = sd[emb + "position_embeddings.weight"]
    out = {"embeddings.cls_token": sd[emb + "cls_embedding"].view(1, 1, h),
           "embeddings.mask_token": sd[emb + "mask_token"].view(1, h),
           "embeddings.position_embeddings": torch.cat([table[-1:], table[:-1]]).unsqueeze(0),  # cls row first
           # (row, column, channel) flattening of our Linear -> the Conv2d's [out, channel, row, column]
           "embeddings.patch_embeddings.projection.weight": sd[emb + "linear_proj.weight"].view(h, p, p, 3)
           .permute(0, 3, 1, 2),
           "embeddings.patch_embeddings.projection.bias": sd[emb + "linear_proj.bias"],
           "layernorm.weight": sd["encoder.transformer_encoder.norm.weight"],
           "layernorm.bias": sd["encoder.transformer_encoder.norm.bias"]}
    for i in range(cfg["num_hidden_layers"]):
        ours, theirs = f"encoder.transformer_encoder.layers.{i}.", f"encoder.layer.{i}."
        pairs = {"norm1": "norm1", "norm2": "norm2", "attention.q_proj": "self_attn.proj_q_dense_layer",
                 "attention.k_proj": "self_attn.proj_k_dense_layer", "attention.v_proj": "self_attn.proj_v_dense_layer",
                 "attention.o_proj": "self_attn.proj_output_dense_layer", "mlp.fc1": "ffn.ffn.0.linear_layer",
                 "mlp.fc2": "ffn.ffn.1.linear_layer"}
        for hf_name, name in pairs.items():
            for kind in ("weight", "bias"):
                key = f"{ours}{name}.{kind}"
                if key in sd:
                    out[f"{theirs}{hf_name}.{kind}"] = sd[key]
                elif f"{theirs}{hf_name}.{kind}" in hf.state_dict():
                    out[f"{theirs}{hf_name}.{kind}"] = torch.zeros_like(hf.state_dict()[f"{theirs}{hf_name}.{kind}"])
        out[f"{theirs}layer_scale1.lambda1"] = sd[f"{ours}layer_scale1"]
        out[f"{theirs}layer_scale2.lambda1"] = sd[f"{ours}layer_scale2"]
    hf.load_state_dict(out)
    return hf


def _head(head, x: torch.Tensor) -> torch.Tensor:
    """DinoHead by hand: Linear, GELU, Linear, GELU, Linear, L2 normalisation, g * v / ||v||."""
    layers = [m for m in head.mlp if isinstance(m, torch.nn.Linear)]
    for n, layer in enumerate(layers):
        x = F.linear(x, layer.weight, layer.bias)
        x = F.gelu(x) if n < len(layers) - 1 else x
    x = x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    v, g = head.last_layer.weight_v, head.last_layer.weight_g
    return x @ (g * v / v.norm(dim=1, keepdim=True)).T


def _ce(teacher_logits, student_logits, t_temp, s_temp):
    """sum(-softmax(teacher / t_temp) * log_softmax(student / s_temp)) over the last dim (centers are 0 at step 0)."""
    return -(F.softmax(teacher_logits / t_temp, dim=-1) * F.log_softmax(student_logits / s_temp, dim=-1)).sum(-1)


def test_first_loss_is_the_dino_and_ibot_rule_on_dinov2_trunk_outputs(tmp_path, images):
    params = tiny("params_dinov2_large_patch14_img224", images, tmp_path)
    keys = _model_keys(params, stochastic_depth_drop_prob=0.0)  # no random drops in this one forward
    torch.manual_seed(0)
    model = build_model(**keys)
    batch = _batch(params)
    gv, lv, masks = batch["global_view"].float(), batch["local_view"].float(), batch["collated_masks"]
    b, g = gv.shape[:2]
    assert masks.any() and not masks.all()
    cfg = keys["image_model_trunks"][0]["image_model"]
    teacher, student = model.image_model_trunks.model
    with torch.no_grad():
        hf_teacher = _dinov2(teacher, cfg)(pixel_values=gv.flatten(0, 1)).last_hidden_state.view(b, g, -1, 64)
        hf_student = _dinov2(student, cfg)(pixel_values=gv.flatten(0, 1),
                                           bool_masked_pos=masks.flatten(0, 1)).last_hidden_state.view(b, g, -1, 64)
        ours_teacher = teacher(gv, None, None)[0]
        ours_student = student(gv, None, masks)[0]
        assert torch.allclose(ours_teacher, hf_teacher, atol=1e-5, rtol=1e-5)
        assert torch.allclose(ours_student, hf_student, atol=1e-5, rtol=1e-5)
        local_cls = student(lv, None, None)[1]  # the interpolated positions: test_interpolated_positions_...
        heads = model.heads.model
        t_cls, s_cls, s_local = _head(heads[0], hf_teacher[:, :, 0]), _head(heads[1], hf_student[:, :, 0]), \
            _head(heads[1], local_cls)
        t_patch, s_patch = _head(heads[2], hf_teacher[:, :, 1:]), _head(heads[3], hf_student[:, :, 1:])
    dino_cfg, ibot_cfg = (entry["loss"] for entry in keys["losses"])
    t0 = dino_cfg["warmup_teacher_temp"]  # the schedules' value at step 0
    pairs = [_ce(t_cls[:, t], s_cls[:, s], t0, 0.1).mean() for t in range(g) for s in range(g) if s != t]
    pairs += [_ce(t_cls[:, t], s_local[:, s], t0, 0.1).mean() for t in range(g) for s in range(s_local.shape[1])]
    dino = sum(pairs) / len(pairs)
    m = masks.float()
    per_image = (_ce(t_patch, s_patch, ibot_cfg["warmup_teacher_temp"], 0.1) * m).sum(-1) / m.sum(-1).clamp(min=1)
    ibot = per_image.sum() / (b * g)
    model.train()
    loss = model(batch)
    print(f"first loss {loss.item()!r}: dino {dino.item()!r} + ibot {ibot.item()!r}")
    assert loss.item() == pytest.approx((dino + ibot).item(), rel=1e-5)


def test_interpolated_positions_are_bicubic_of_the_patch_grid():
    """A 2 x 2 local crop of a 4 x 4 table: the table's patch rows as a grid, F.interpolate(bicubic, scale
    (2 + 0.1) / 4) (DINOv2's interpolate_pos_encoding), the cls row (the table's last) first."""
    cfg = ViTModelConfig(hidden_size=8, num_heads=2, image_size=[56, 56], patch_size=[14, 14],
                         interpolate_position_embedding={"local_patch_dims": [2, 2]})
    torch.manual_seed(0)
    layer = ViTEmbeddingLayer(cfg)
    table = layer.position_embeddings.weight.detach()
    grid = table[:-1].T.reshape(1, 8, 4, 4)
    expected = F.interpolate(grid, scale_factor=(2.1 / 4, 2.1 / 4), mode="bicubic").reshape(8, 4).T
    got = layer._positions(torch.zeros(1, 5, 8)).detach()
    assert torch.allclose(got[0], table[-1]) and torch.allclose(got[1:], expected, atol=1e-6)
    with pytest.raises(ValueError, match=r"local_patch_dims does not give that grid"):
        layer._positions(torch.zeros(1, 10, 8))


def test_head_last_layer_is_torch_weight_norm():
    torch.manual_seed(0)
    ours = WeightNormLinear(6, 5)
    with torch.no_grad():
        ours.weight_g.uniform_(0.5, 2.0)
    ref = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(6, 5, bias=False))
    ref.parametrizations.weight.original0.data.copy_(ours.weight_g)
    ref.parametrizations.weight.original1.data.copy_(ours.weight_v)
    x = torch.randn(3, 6)
    assert torch.allclose(ours(x), ref(x), atol=1e-6)
    assert {n for n, _ in ours.named_parameters()} == {"weight_g", "weight_v"}


def test_teacher_follows_the_student_by_the_cosine_ema(tmp_path, images):
    params = tiny("params_dinov2_large_patch14_img224", images, tmp_path)
    torch.manual_seed(0)
    model = build_model(**_model_keys(params))
    teacher, student = model.image_model_trunks.model
    sd_t, sd_s = teacher.state_dict(), student.state_dict()
    assert all(torch.equal(sd_t[k], sd_s[k]) for k in sd_t)  # copy_init_weights
    assert not any(p.requires_grad for p in teacher.parameters()) and all(p.requires_grad for p in student.parameters())
    model.train()
    batch = _batch(params)
    model(batch)  # step 0: no EMA
    assert all(torch.equal(teacher.state_dict()[k], sd_s[k]) for k in sd_t)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.5)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    model(batch)  # step 1: teacher = d teacher + (1 - d) student before the forward
    sched = params["trainer"]["init"]["model"]["ema"][0]["scheduler_params"]
    start, end, total = sched["ema_decay_start"], sched["ema_decay_end"], sched["total_steps"]
    d = end + 0.5 * (start - end) * (1 + math.cos(math.pi * 1 / total))
    name = "encoder.transformer_encoder.layers.0.norm1.weight"
    expected = d * before[name] + (1 - d) * student.state_dict()[name]
    assert torch.allclose(teacher.state_dict()[name], expected, atol=1e-7)
    assert not torch.equal(teacher.state_dict()[name], before[name])
    assert model.ema_step.item() == 2 and model.losses.model[0].step.item() == 2


BAD = [
    (lambda k: k["heads"][1]["forward_args"][0].__setitem__(0, "image_model_trunks.output(1,5,1)"),
     r"^heads\[1\]\.forward_args\[0\]\[0\]: image_model_trunks\.output\(1,5,1\): image_model_trunks\[1\] has 2 "
     r"forward passes"),
    (lambda k: k["image_model_trunks"][0]["forward_args"][0].__setitem__(0, "heads.output(0,0,0)"),
     r"^image_model_trunks\[0\]\.forward_args\[0\]\[0\]: heads\.output\(0,0,0\) is not computed before this pass"),
    (lambda k: k["image_model_trunks"][0]["forward_args"][0].__setitem__(0, "ssl_transform.output('views')"),
     r"^image_model_trunks\[0\]\.forward_args\[0\]\[0\]: .*the batch has local_view, global_view"),
    (lambda k: k["heads"][0]["forward_args"][0].append(None),
     r"^heads\[0\]\.forward_args\[0\]: DinoHead takes 1 arguments, got 2"),
    (lambda k: k["heads"][0]["head_model"].__setitem__("bottleneck", 3),
     r"^heads\[0\]\.head_model\.bottleneck: unknown key; expected one of input_size"),
    (lambda k: k["losses"][0]["loss"].__setitem__("name", "SinkhornLoss"),
     r"^losses\[0\]\.loss\.name: 'SinkhornLoss' is not one of DinoDistillationLoss, iBOTPatchLoss, KoLeoLoss"),
    (lambda k: k["losses"][1]["loss"].pop("teacher_temp"), r"^losses\[1\]\.loss\.teacher_temp: missing"),
    (lambda k: k["image_model_trunks"][1]["image_model"]["interpolate_position_embedding"].__setitem__("size", 2),
     r"^image_model_trunks\[0\]\.image_model\.interpolate_position_embedding\.size: unknown key"),  # a shared anchor
    (lambda k: k["ema"][0].__setitem__("source", "heads.model(7)"), r"^ema\[0\]\.source: 'heads\.model\(7\)': heads has 4"),
    (lambda k: k["ema"][1].__setitem__("scheduler_name", "step"), r"^ema\[1\]\.scheduler_name: 'step' is not one of"),
    (lambda k: k["copy_init_weights"][0].__setitem__("target", "trunk(1)"), r"^copy_init_weights\[0\]\.target: 'trunk\(1\)'"),
    (lambda k: k["freeze"].append("teacher_trunk"), r"^freeze\[3\]: 'teacher_trunk' matches no module"),
]


@pytest.mark.parametrize("change, message", BAD)
def test_bad_model_keys_are_one_error_naming_the_key(tmp_path, images, change, message):
    keys = _model_keys(tiny("params_dinov2_large_patch14_img224", images, tmp_path))
    change(keys)
    with pytest.raises(ValueError, match=message) as info:
        build_model(**keys)
    assert "\n" not in str(info.value)


def test_koleo_is_minus_the_mean_log_nearest_neighbour_distance():
    torch.manual_seed(0)
    x = torch.randn(5, 2, 4)
    expected = 0.0
    for v in range(2):
        u = x[:, v] / x[:, v].norm(dim=-1, keepdim=True)
        dist = torch.cdist(u, u) + torch.eye(5) * 10  # not itself
        expected -= torch.log(dist.min(dim=1).values + 1e-8).mean()
    assert KoLeoLoss()(x).item() == pytest.approx(expected.item(), rel=1e-5)
    with pytest.raises(ValueError, match="batch_size >= 2"):
        KoLeoLoss()(x[:1])


@pytest.mark.parametrize("kind", ["linear_constant", "linear_cosine"])
def test_teacher_temperature_warms_up_linearly_then_holds(kind):
    """The vendor's schedulers: start at step 0, teacher_temp at step warmup - 1 and after."""
    cfg = TempLossConfig(input_size=4, warmup_teacher_temp=0.04, teacher_temp=0.07, warmup_teacher_temp_steps=11,
                         total_steps=30, teacher_temp_scheduler=kind)
    temps = [teacher_temperature(cfg, torch.tensor([s], dtype=torch.int32)).item() for s in (0, 5, 10, 11, 29)]
    assert temps == pytest.approx([0.04, 0.04 + 0.03 * 5 / 10, 0.07, 0.07, 0.07], rel=1e-6)


def test_a_bad_key_in_a_params_file_is_one_error_line_with_its_file_and_line(tmp_path, images):
    params = tiny("params_dinov2_large_patch14_img224", images, tmp_path)
    params["trainer"]["init"]["model"]["heads"][1]["forward_args"][0][0] = "image_model_trunks.output(1,3,1)"
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    result = CliRunner().invoke(cli, ["validate-only", "--params", str(path), "--model_dir", str(tmp_path / "m")])
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 2 and len(errors) == 1
    assert "heads[1].forward_args[0][0]: image_model_trunks.output(1,3,1): image_model_trunks[1] has 2 forward " \
           "passes" in errors[0] and f"({path}:" in errors[0]
    assert not (tmp_path / "m").exists()
