"""Tiny random Hugging Face models built locally (nothing downloaded) and the comparison every family
test makes: the same weights through transformers and through cs-run give the same logits and loss."""

from __future__ import annotations

import pytest
import torch
import yaml

from cs_run.checkpoint import save
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
