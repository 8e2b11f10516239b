"""dit (the Model Zoo 2.10 DiT) against an eager re-implementation written here from the vendor's code and the
DiT paper (sin-cos tables, the linear beta schedule, adaLN-zero blocks, the conv-transpose head, MSE on the noise),
its checkpoint keys against the vendor's module names, and the Release 2.10 params files
(src/cerebras/modelzoo/models/vision/dit/configs/, read from the local mirror of github:Cerebras/modelzoo, never
copied here) shrunk by tools/modelzoo_files.py (sizes, batch, steps and data paths only) over latents written in
the vendor's layout: validate-only, 5 training steps on CPU and 5 on CSX fx with the same losses, the first loss by
hand from the run's own first batch."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner
from modelzoo_file_helpers import cli, in_process_every_step, mz, needs_mirror, shrunk, train_on_cpu_and_csx, write

from cs_run.data.processors.diffusion_latent import build_dataloader
from cs_run.frontends.cli import cli as main_cli
from cs_run.models.dit.model import DiTModel, build_model
from cs_run.registry import get_model_spec
from cs_run.summaries import read_scalars

FILES = ("small", "base", "large", "xlarge", "2B")
pytestmark = needs_mirror


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dit_shards")
    mz.write_dit_latents(out / "dit")
    return out


def _shrunk(name: str, shards: Path, tmp_path: Path) -> dict:
    path = f"src/cerebras/modelzoo/models/vision/dit/configs/params_dit_{name}_patchsize_2x2.yaml"
    return in_process_every_step(shrunk(path, shards, tmp_path))


def _model_keys(params: dict) -> dict:
    return {k: v for k, v in params["trainer"]["init"]["model"].items() if k != "name"}


def _train_section(params: dict) -> dict:
    """The train loader's keys as the run passes them: the model's input_keys copied in, ``split`` dropped."""
    model = params["trainer"]["init"]["model"]
    section = {k: v for k, v in params["trainer"]["fit"]["train_dataloader"].items() if k != "split"}
    for key in get_model_spec("dit").input_keys:
        if key in model:
            section[key] = model[key]
    return section


# ---------------------------------------------------------------- the eager reference

def _abar(steps: int, start: float = 1e-4, end: float = 0.02) -> np.ndarray:
    """Ho et al.'s linear betas (scaled to ``steps``) and their running product of 1 - beta, in float64."""
    scale = 1000 / steps
    return np.cumprod(1 - np.linspace(scale * start, scale * end, steps))


def _timestep_features(t: torch.Tensor, dim: int) -> torch.Tensor:
    """cos then sin of ``t * 10000^(-i / (dim / 2))``, in float64."""
    freqs = np.exp(-math.log(10000) * np.arange(dim // 2) / (dim // 2))
    args = t.numpy().astype(np.float64)[:, None] * freqs[None]
    return torch.from_numpy(np.concatenate([np.cos(args), np.sin(args)], axis=1)).float()


def _positions(grid: tuple[int, int], hidden: int) -> torch.Tensor:
    """Patch (r, c) in row-major order: sin, cos of the column's frequencies, then sin, cos of the row's."""
    q = hidden // 4
    freqs = [10000 ** (-i / q) for i in range(q)]
    rows = []
    for r in range(grid[0]):
        for c in range(grid[1]):
            rows.append([math.sin(c * f) for f in freqs] + [math.cos(c * f) for f in freqs]
                        + [math.sin(r * f) for f in freqs] + [math.cos(r * f) for f in freqs])
    return torch.tensor(rows, dtype=torch.float32)


def reference_loss(w: dict, keys: dict, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(predicted noise, loss) of the DiT with weights ``w`` (the model's state dict) on ``batch``, in float32:
    pre-norm adaLN-zero blocks, fixed positions, a conv patch embedding and conv-transpose head."""
    x0, eps, t, label = batch["input"].float(), batch["diffusion_noise"].float(), batch["timestep"], batch["label"]
    hidden, heads, eps_ln = keys["hidden_size"], keys["num_heads"], keys["layer_norm_epsilon"]
    abar = torch.tensor(_abar(keys["num_diffusion_steps"]), dtype=torch.float64)[t.long()]
    xt = abar.sqrt().float().view(-1, 1, 1, 1) * x0 + (1 - abar).sqrt().float().view(-1, 1, 1, 1) * eps
    p = keys["patch_size"]
    m = "model."
    x = F.conv2d(xt, w[m + "patch_embedding_layer.linear_proj.weight"], w[m + "patch_embedding_layer.linear_proj.bias"],
                 stride=p)
    grid = x.shape[2:]
    x = x.flatten(2).transpose(1, 2) + _positions(tuple(grid), hidden)

    def linear(prefix, v):
        return v @ w[prefix + ".weight"].T + w[prefix + ".bias"]
    # the float32 table (checked against the formula above, within 5e-5); its rounding is amplified by random weights
    tf = w[m + "timestep_embedding_layer.timestep_embedding"][t.long()]
    temb = linear(m + "timestep_embedding_layer.ffn.ffn.1.linear_layer",
                  F.silu(linear(m + "timestep_embedding_layer.ffn.ffn.0.linear_layer", tf)))
    c = temb + w[m + "label_embedding_layer.weight"][label.long()]

    def ada(prefix, v):
        scale, shift = linear(prefix + ".scale_linear.1", F.silu(c)), linear(prefix + ".shift_linear.1", F.silu(c))
        return (1 + scale[:, None]) * F.layer_norm(v, (hidden,), eps=eps_ln) + shift[:, None]

    b, s, d = x.shape[0], x.shape[1], hidden // heads
    for i in range(keys["num_hidden_layers"]):
        L = f"{m}transformer_decoder.layers.{i}."
        h = ada(L + "norm1", x)
        q, k, v = (linear(L + f"self_attn.proj_{n}_dense_layer", h).view(b, s, heads, d).transpose(1, 2)
                   for n in "qkv")
        attn = torch.softmax((q / math.sqrt(d)) @ k.transpose(-1, -2), dim=-1) @ v
        attn = linear(L + "self_attn.proj_output_dense_layer", attn.transpose(1, 2).reshape(b, s, hidden))
        x = x + linear(L + "gate_msa.1", F.silu(c))[:, None] * attn
        f = linear(L + "ffn.ffn.1.linear_layer", F.gelu(linear(L + "ffn.ffn.0.linear_layer", ada(L + "norm3", x))))
        x = x + linear(L + "gate_mlp.1", F.silu(c))[:, None] * f
    x = ada(m + "final_norm", x)
    pred = F.conv_transpose2d(x.transpose(1, 2).reshape(b, hidden, *grid), w[m + "noise_head.conv_transpose.weight"],
                              w[m + "noise_head.conv_transpose.bias"], stride=p)
    return pred, ((pred - eps) ** 2).mean()


# ---------------------------------------------------------------- tests

VENDOR_KEYS = {  # modeling_dit.DiT's modules and the layers they build (Release 2.10), one block
    "patch_embedding_layer.linear_proj.weight", "patch_embedding_layer.linear_proj.bias",
    "patch_embedding_layer.position_embeddings", "timestep_embedding_layer.timestep_embedding",
    *(f"timestep_embedding_layer.ffn.ffn.{i}.linear_layer.{p}" for i in (0, 1) for p in ("weight", "bias")),
    "label_embedding_layer.weight",
    *(f"transformer_decoder.layers.0.self_attn.proj_{n}_dense_layer.{p}" for n in ("q", "k", "v", "output")
      for p in ("weight", "bias")),
    *(f"transformer_decoder.layers.0.{n}.{a}_linear.1.{p}" for n in ("norm1", "norm3") for a in ("scale", "shift")
      for p in ("weight", "bias")),
    *(f"transformer_decoder.layers.0.ffn.ffn.{i}.linear_layer.{p}" for i in (0, 1) for p in ("weight", "bias")),
    *(f"transformer_decoder.layers.0.{g}.1.{p}" for g in ("gate_msa", "gate_mlp") for p in ("weight", "bias")),
    *(f"final_norm.{a}_linear.1.{p}" for a in ("scale", "shift") for p in ("weight", "bias")),
    "noise_head.conv_transpose.weight", "noise_head.conv_transpose.bias",
    "gaussian_diffusion.sqrt_alphas_cum_prod", "gaussian_diffusion.sqrt_one_minus_alphas_cum_prod",
}


def test_checkpoint_keys_are_the_vendor_module_names_and_tables_are_not_trained(tmp_path, shards):
    keys = {**_model_keys(_shrunk("small", shards, tmp_path)), "num_hidden_layers": 1}
    model = build_model(**keys)
    assert set(model.state_dict()) == {"model." + k for k in VENDOR_KEYS}
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {"model.patch_embedding_layer.position_embeddings",
                      "model.timestep_embedding_layer.timestep_embedding", "model.gaussian_diffusion.sqrt_alphas_cum_prod",
                      "model.gaussian_diffusion.sqrt_one_minus_alphas_cum_prod"}
    # adaLN-zero: every block starts as the identity and the head predicts zero noise
    zero = [n for n, p in model.named_parameters() if "gate_" in n or "_linear.1" in n or "noise_head" in n]
    assert len(zero) == 18 and all(not model.state_dict()[n].any() for n in zero)
    assert model.model.label_embedding_layer.weight.shape == (1001, 64)  # the null class of label dropout


def test_fixed_tables_are_the_formulas(tmp_path, shards):
    """The timestep table (float32 frequencies and arguments, as the vendor's: within 5e-5 of the exact values up to
    t = 999), the 2-D position table and the schedule's square roots against the formulas in float64."""
    model = build_model(**_model_keys(_shrunk("small", shards, tmp_path))).model
    t = torch.arange(1000)
    torch.testing.assert_close(model.timestep_embedding_layer.timestep_embedding, _timestep_features(t, 32), rtol=0,
                               atol=5e-5)
    torch.testing.assert_close(model.patch_embedding_layer.position_embeddings, _positions((4, 4), 64), rtol=0, atol=1e-6)
    abar = _abar(1000)
    torch.testing.assert_close(model.gaussian_diffusion.sqrt_alphas_cum_prod, torch.tensor(np.sqrt(abar)).float())
    torch.testing.assert_close(model.gaussian_diffusion.sqrt_one_minus_alphas_cum_prod,
                               torch.tensor(np.sqrt(1 - abar)).float())


def test_noising_is_the_formula_in_the_autocast_type(tmp_path, shards):
    """x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps (float64 by hand); under bf16 autocast the vendor's half type."""
    diffusion = build_model(**_model_keys(_shrunk("small", shards, tmp_path))).model.gaussian_diffusion
    torch.manual_seed(0)
    x, eps, t = torch.randn(3, 4, 8, 8), torch.randn(3, 4, 8, 8), torch.tensor([0, 500, 999], dtype=torch.int32)
    abar = torch.tensor(_abar(1000))[t.long()].view(-1, 1, 1, 1)
    expected = (abar.sqrt() * x.double() + (1 - abar).sqrt() * eps.double()).float()
    torch.testing.assert_close(diffusion(x, eps, t), expected, rtol=1e-6, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = diffusion(x, eps, t)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), expected, rtol=2e-2, atol=2e-2)


def test_model_is_the_eager_reference_with_random_weights(tmp_path, shards):
    """Every weight random (the zero-initialized adaLN, gates and head too), float32, no dropout: predicted noise
    and loss within 1e-5 of the reference on a batch of the file's data."""
    params = _shrunk("small", shards, tmp_path)
    keys = _model_keys(params)
    torch.manual_seed(0)
    model = build_model(**keys).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn_like(p) * 0.2)
    batch = next(iter(build_dataloader("train", **_train_section(params))))
    assert batch["label"].max() <= 1000 and batch["timestep"].max() < 1000
    with torch.no_grad():
        loss = model(batch)
        pred, _ = model.model(batch["input"], batch["label"], batch["diffusion_noise"], batch["timestep"])
    ref_pred, ref_loss = reference_loss(model.state_dict(), keys, batch)
    assert ref_pred.abs().mean() > 0.1  # not the zero-initialized head
    torch.testing.assert_close(pred, ref_pred, rtol=1e-5, atol=1e-5)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)


@pytest.mark.slow
def test_small_file_validates_and_its_first_loss_is_the_batch_noise_mean_square(tmp_path, shards, monkeypatch):
    """The tiny params_dit_small file (the smoke test; all 5 files on CPU and CSX: the sweep test below) passes
    validate-only and trains 2 steps on CPU (bf16 autocast, as the file); the first step's loss is the reference
    loss of the run's own first batch and starting weights: with the zero head, the mean square of that batch's
    diffusion noise."""
    params = _shrunk("small", shards, tmp_path)
    params["trainer"]["init"]["loop"]["max_steps"] = 2
    params = write(params, tmp_path / "p.yaml")
    cli("validate-only", "--params", params, "--model_dir", tmp_path / "v")
    seen = []
    forward = DiTModel.forward

    def recording(self, batch):
        if not seen:
            seen.append(({k: v.clone() for k, v in batch.items()}, {k: v.clone() for k, v in self.state_dict().items()}))
        return forward(self, batch)
    monkeypatch.setattr(DiTModel, "forward", recording)
    cli("train", "--params", params, "--model_dir", tmp_path / "cpu", "--device", "CPU")
    losses = read_scalars(tmp_path / "cpu" / "train")["loss"]
    assert [step for step, _ in losses] == [1, 2] and all(np.isfinite(v) for _, v in losses)
    batch, weights = seen[0]
    raw = yaml.safe_load(params.read_text())
    _, expected = reference_loss(weights, _model_keys(raw), batch)
    assert expected.item() == pytest.approx(batch["diffusion_noise"].float().pow(2).mean().item(), rel=1e-6)
    assert losses[0][1] == pytest.approx(expected.item(), rel=1e-6)
    # the same seed gives the same first batch: the file's seed, the model built, then the data function (the
    # runner's order; all draws come from torch's generator, as the vendor's collate draws them)
    torch.manual_seed(raw["trainer"]["init"]["seed"])
    build_model(**_model_keys(raw))
    again = next(iter(build_dataloader("train", **_train_section(raw))))
    assert all(torch.equal(again[k], batch[k]) for k in batch)


@pytest.mark.sweep
@pytest.mark.parametrize("name", FILES)
def test_file_validates_and_trains_5_steps_on_cpu_and_csx(tmp_path, shards, name):
    cpu, csx = train_on_cpu_and_csx(write(_shrunk(name, shards, tmp_path), tmp_path / "p.yaml"), tmp_path)
    assert [step for step, _ in cpu] == [1, 2, 3, 4, 5]
    assert cpu == csx and all(np.isfinite(loss) for _, loss in cpu)


TINY = dict(hidden_size=16, num_heads=2, num_hidden_layers=1, filter_size=32, frequency_embedding_size=8,
            latent_size=[4, 4], latent_channels=4, patch_size=[2, 2], position_embedding_type="fixed")


@pytest.mark.parametrize("change, message", [
    ({"latent_size": None}, r"^latent_size: not set and no vae section to take it from; set model\.latent_size"),
    ({"patch_size": [3, 3]}, r"^patch_size: \[3, 3\] does not divide latent_size \[4, 4\] \(height\)"),
    ({"hidden_size": 18}, r"^hidden_size: 18; fixed 2-D position embeddings need a multiple of 4"),
    ({"position_embedding_type": "rotary"}, r"^position_embedding_type: 'rotary' is not one of learned, fixed, None"),
    ({"schedule_name": "cosine"}, r"^schedule_name: 'cosine' is not one of linear"),
    ({"vae": {"latent_sizes": [4, 4]}}, r"^vae\.latent_sizes: unknown key; expected one of act_fn, "),
    ({"block_type": "adaln"}, r"^block_type: 'adaln' is not one of adaln_zero"),
    ({"reverse_process": {"samplr": {}}}, r"^reverse_process\.samplr: unknown key; expected one of pipeline"),
])
def test_bad_model_keys_are_one_error_naming_the_key(change, message):
    with pytest.raises(ValueError, match=message) as info:
        build_model(**{**TINY, **change})
    assert "\n" not in str(info.value)


def test_a_bad_key_in_the_file_is_one_error_line_naming_file_and_key(tmp_path, shards):
    params = _shrunk("small", shards, tmp_path)
    params["trainer"]["init"]["model"]["schedule_name"] = "cosine"
    path = write(params, tmp_path / "p.yaml")
    result = CliRunner().invoke(main_cli, ["validate-only", "--params", str(path), "--model_dir", str(tmp_path / "v")])
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    assert "schedule_name: 'cosine' is not one of linear" in errors[0] and str(path) in errors[0]


def test_latent_shape_and_scaling_come_from_vae_with_the_vendor_defaults():
    """model.latent_size / latent_channels unset: vae's, and VAEConfig's defaults where vae omits them (the data's
    defaults are the same: tests/data/test_dit_data.py's "vae defaults")."""
    config = build_model(**{**TINY, "latent_size": None, "latent_channels": None, "vae": {"scaling_factor": 0.5}}).config
    assert (config["latent_size"], config["latent_channels"], config["vae"]["scaling_factor"]) == ([32, 32], 4, 0.5)
    config = build_model(**{**TINY, "latent_size": None, "vae": {"latent_size": [6, 6]}}).config
    assert config["latent_size"] == [6, 6]
