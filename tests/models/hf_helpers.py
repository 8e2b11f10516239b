"""Tiny random Hugging Face models built locally (nothing downloaded) and the comparison every family
test makes: the same weights through transformers and through cs-run give the same logits and loss."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from cs_run.checkpoint import save
from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli
from cs_run.frontends.cli import cli as main_cli
from cs_run.registry import get_model_spec, hf_converter, resolve_object

# float32 on CPU: the two implementations order their sums differently (SDPA vs matmul, fused vs split
# projections), a few ulps per op over 2 layers; 1e-5 is ~100x that and far below any real difference.
TOL = dict(rtol=1e-5, atol=1e-5)


def tiny_hf(config_cls: str, model_cls: str, seed: int = 0, **config):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_cls)(**config)
    model = getattr(transformers, model_cls)(cfg).eval()
    with torch.no_grad():  # HF zero-initializes biases and sets norms to one: perturb every tensor
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def build(keys: dict):
    """The cs-run model of a ``model:`` section, through the registry as a run builds it."""
    keys = dict(keys)
    fn = resolve_object(get_model_spec(keys.pop("name")).model_fn)
    return fn(**keys).eval()


def hf_logits_and_loss(hf, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        out = hf(input_ids=ids, labels=ids)
    # HF shifts labels inside; the cs-run batch carries them shifted (labels[t] = ids[t + 1])
    return out.logits, out.loss


def ours_logits_and_loss(model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.roll(ids, -1, dims=1)
    mask = torch.ones_like(ids)
    mask[:, -1] = 0  # the last position has no next token
    with torch.no_grad():
        out = model.model(ids)
        logits = out[0] if isinstance(out, tuple) else out  # MoE: (logits, per-layer routing)
        loss = model({"input_ids": ids.int(), "labels": labels.int(), "attention_mask": mask.int()})
    return logits, loss


def assert_same(hf, model, vocab: int, seq: int, batch: int = 2) -> None:
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    hf_logits, hf_loss = hf_logits_and_loss(hf, ids)
    logits, loss = ours_logits_and_loss(model, ids)
    torch.testing.assert_close(logits, hf_logits, **TOL)
    torch.testing.assert_close(loss, hf_loss, **TOL)


def cs_run_weights_as_transformers(tmp_path, config_cls: str, model_cls: str, name: str, **config):
    """(cs-run DecoderLM, transformers model) with the same weights, cs-run's own: the family's model keys come
    from a tiny transformers config through ``checkpoint convert --from hf``, a model of those keys gets random
    weights (std 0.1, norms about 1), and ``--to hf`` writes them as the transformers folder ``tmp_path/hf``."""
    transformers = pytest.importorskip("transformers")
    converter = hf_converter(name, "test")
    tiny_hf(config_cls, model_cls, **config).save_pretrained(str(tmp_path / "shape"))
    _, params = converter.from_hf(tmp_path / "shape", tmp_path / "shape.mdl")
    keys = yaml.safe_load(params.read_text())["model"]
    torch.manual_seed(7)
    model = build(keys)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.ndim == 1 and "norm" in n else 0.0))
    save({"model": model.state_dict()}, str(tmp_path / "ours.mdl"))
    converter.to_hf(tmp_path / "ours.mdl", tmp_path / "hf", keys)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    return model.model.eval(), hf


def assert_bit_equal(ours: dict, theirs: dict) -> None:
    """The same keys, and each tensor equal to the bit (a state dict written back where nothing is recomputed)."""
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key


def eval_loss(params: dict, path: Path, checkpoint: Path) -> float:
    """The eval/loss ``cs-run eval`` prints for ``params`` (written to ``path``) from ``checkpoint``."""
    path.write_text(yaml.safe_dump(params))
    result = CliRunner().invoke(main_cli, ["eval", "--params", str(path), "--checkpoint_path", str(checkpoint)])
    assert result.exit_code == 0, result.output
    return float(re.search(r"eval/loss = ([0-9.]+)", result.output).group(1))


def to_hf_is_refused(tmp_path: Path, keys: dict) -> str:
    """``checkpoint convert --to hf`` of a model of ``keys`` (a ``model:`` section) fails and writes no folder: for the
    keys transformers cannot express. Returns the command's output."""
    save({"model": build(keys).state_dict()}, str(tmp_path / "model.mdl"))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"model": keys}))
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--to", "hf", str(tmp_path / "model.mdl"),
                                                 str(tmp_path / "out"), "--params", str(tmp_path / "params.yaml")])
    assert result.exit_code != 0, result.output
    assert not (tmp_path / "out").exists()
    return result.output


def back_to_hf_is_exact(tmp_path: Path, model_type: str) -> Path:
    """``checkpoint convert --to hf`` of ``tmp_path/model.mdl`` (params ``model.yaml``, as ``--from hf`` wrote them)
    into ``tmp_path/back``: the weights of ``tmp_path/hf`` bit for bit, config.json's model_type ``model_type``.
    Returns the folder."""
    st = pytest.importorskip("safetensors.torch")
    back = tmp_path / "back"
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--to", "hf", str(tmp_path / "model.mdl"), str(back),
                                                 "--params", str(tmp_path / "model.yaml")])
    assert result.exit_code == 0, result.output
    theirs = st.load_file(str(tmp_path / "hf" / "model.safetensors"))
    ours = st.load_file(str(back / "model.safetensors"))
    assert_bit_equal(ours, theirs)
    assert json.loads((back / "config.json").read_text())["model_type"] == model_type
    return back
