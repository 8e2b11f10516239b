"""configure_param_groups: Model Zoo 2.10's grouping by tags, weight decay and muP lr scale
(``common/optim_utils.py`` and ``mup_utils.process_lr_adjustment_params``), the expected groups worked out
by hand from that code."""

from __future__ import annotations

import types

import pytest
import torch

import cs_run.optim as csoptim
from cs_run.optim import lr_scheduler as ls


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(5, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.decoder = torch.nn.Linear(4, 3)
        self.frozen = torch.nn.Linear(3, 3)
        self.frozen.requires_grad_(False)


class _Block(torch.nn.Module):
    """Parameter names shaped like the Model Zoo GPT-2 decoder's (attn dense, ffn.ffn.0 / ffn.ffn.1)."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = torch.nn.Module()
        self.attn.dense = torch.nn.Linear(4, 4)
        self.ffn = torch.nn.Module()
        self.ffn.ffn = torch.nn.ModuleList([torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)])
        self.norm = torch.nn.LayerNorm(4)


class _MupNet(torch.nn.Module):
    """A model with its own lr_adjustment_groups (the Model Zoo's LRAdjustmentGroup shape: patterns, scale)."""

    def __init__(self, scales: dict[str, float]) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(5, 4)
        self.decoder = torch.nn.ModuleList([_Block()])
        patterns = {"embedding": "*embedding*weight", "decoder_kernel": "*decoder*attn*dense*weight",
                    "decoder_input_ffn": "*decoder*ffn.ffn.[!1]*weight", "decoder_output_ffn": "*decoder*ffn.ffn.[1]*weight"}
        self.lr_adjustment_groups = {name: types.SimpleNamespace(param_filter_patterns=glob, scale=scales.get(name, 1.0))
                                     for name, glob in patterns.items()}


def _names(model, group):
    by_id = {id(p): n for n, p in model.named_parameters()}
    return sorted(by_id[id(p)] for p in group["params"])


def _summary(model, groups):
    return [(g["weight_decay"], g.get("adjust_learning_rate"), _names(model, g)) for g in groups]


def test_weight_decay_split_and_frozen_params():
    model = _Net()
    groups = csoptim.configure_param_groups(model, {"weight_decay": 0.1})
    # no scale other than 1.0: the groups carry no adjust_learning_rate (the Model Zoo adds none)
    assert _summary(model, groups) == [
        (0.1, None, ["decoder.weight", "embedding.weight"]),
        (0.0, None, ["decoder.bias", "norm.bias", "norm.weight"]),
    ]
    opt = csoptim.AdamW(groups, lr=0.1)  # the groups feed an optimizer as they are
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_the_models_rmsnorm_is_a_normalization_layer_without_weight_decay():
    """The Model Zoo's rule names its own RMSNorm among the norm classes; cs-run's (models/common/norms.py)
    registers itself the same way, so a llama's norm weights are not decayed."""
    from cs_run.models.common.norms import RMSNorm

    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), RMSNorm(4))
    groups = csoptim.configure_param_groups(model, {"weight_decay": 0.1})
    assert _summary(model, groups) == [(0.1, None, ["0.weight"]), (0.0, None, ["1.weight"])]


def test_tags_and_lr_adjustment():
    model = _Net()
    groups = csoptim.configure_param_groups(model, {
        "weight_decay_rate": 0.01,
        "params": [{"params": "*decoder*", "tag": "head"}],
        "adjust_learning_rate": {"embedding": 0.5},
    })
    # tags first (untagged, then "head", in parameter order), each split by decay, each by scale (0.5, then 1.0)
    assert [(sorted(g.get("tags", [])), *s) for g, s in zip(groups, _summary(model, groups))] == [
        ([], 0.01, 0.5, ["embedding.weight"]),
        ([], 0.0, 1.0, ["norm.bias", "norm.weight"]),
        (["head"], 0.01, 1.0, ["decoder.weight"]),
        (["head"], 0.0, 1.0, ["decoder.bias"]),
    ]


def test_mup_groups_and_their_learning_rates_by_hand():
    """A muP model (hidden 4 over base 16 -> 1/4 on attention and input ffn; filter 8 over base 64 -> 1/8 on the
    output ffn) with ``adjust_learning_rate: {embedding: 2.0}``, under a LinearLR schedule.

    By hand from the Model Zoo's rule: the scales other than 1.0 in the order of the model's groups, equal
    scales merged: [2.0 (embedding), 0.25 (decoder_kernel + decoder_input_ffn), 0.125 (decoder_output_ffn)],
    then 1.0 for the rest; every weight-decay group splits by them, empty parts dropped.
    """
    model = _MupNet({"decoder_kernel": 0.25, "decoder_input_ffn": 0.25, "decoder_output_ffn": 0.125})
    groups = csoptim.configure_param_groups(model, {"weight_decay": 0.1, "adjust_learning_rate": {"embedding": 2.0}})
    assert _summary(model, groups) == [
        (0.1, 2.0, ["embedding.weight"]),
        (0.1, 0.25, ["decoder.0.attn.dense.weight", "decoder.0.ffn.ffn.0.weight"]),
        (0.1, 0.125, ["decoder.0.ffn.ffn.1.weight"]),
        (0.0, 1.0, ["decoder.0.attn.dense.bias", "decoder.0.ffn.ffn.0.bias", "decoder.0.ffn.ffn.1.bias",
                    "decoder.0.norm.bias", "decoder.0.norm.weight"]),
    ]
    opt = csoptim.AdamW(groups, lr=0.0)
    schedule = {"LinearLR": {"initial_learning_rate": 0.0, "end_learning_rate": 0.006, "total_iters": 10}}
    scheduler = csoptim.configure_lr_scheduler(opt, schedule)
    assert isinstance(scheduler, ls.ScalePerParamLR)  # wrapped, as the Model Zoo trainer wraps it
    for _ in range(3):
        scheduler.step()
    base = 0.006 * 3 / 10  # LinearLR at step 3
    assert [float(g["lr"]) for g in opt.param_groups] == pytest.approx([base * 2.0, base * 0.25, base * 0.125, base],
                                                                       rel=1e-6)  # float32 lr tensors


def test_overriding_a_scale_to_one_removes_the_group():
    model = _MupNet({"decoder_output_ffn": 0.125})
    groups = csoptim.configure_param_groups(model, {"adjust_learning_rate": {"decoder_output_ffn": 1}})
    assert [g.get("adjust_learning_rate") for g in groups] == [None, None]


def test_default_groups_without_model_groups():
    """A model without lr_adjustment_groups gets the Model Zoo's defaults: embedding and decoder_kernel
    (``*decoder*dense*weight``, ``*decoder*linear*weight``)."""
    model = _MupNet({})
    del model.lr_adjustment_groups
    groups = csoptim.configure_param_groups(model, {"adjust_learning_rate": {"decoder_kernel": 1 / 3}})
    assert _summary(model, groups)[0] == (0.0, pytest.approx(1 / 3), ["decoder.0.attn.dense.weight"])
    assert groups[1]["adjust_learning_rate"] == 1.0


@pytest.mark.parametrize("params,regex", [
    ({"params": [{"params": "*nothing*", "tag": "x"}]}, r"tag 'x' with patterns '\*nothing\*' matches no parameter"),
    ({"params": [{"tag": "x"}]}, r"^optimizer.params\[0\]: expected a mapping with 'params'"),
    ({"adjust_learning_rate": {"attention": 2.0}},
     r"^optimizer.adjust_learning_rate.attention: the model has no LR adjustment group 'attention' \(it has "
     r"decoder_kernel, embedding\)"),
    ({"adjust_learning_rate": {"embedding": "fast"}}, r"^optimizer.adjust_learning_rate.embedding: expected a number"),
    ({"adjust_learning_rate": [0.5]}, r"^optimizer.adjust_learning_rate: expected a mapping"),
])
def test_bad_optimizer_params(params, regex):
    with pytest.raises(ValueError, match=regex):
        csoptim.configure_param_groups(_Net(), params)
