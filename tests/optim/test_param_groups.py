"""configure_param_groups: Model Zoo 2.10's grouping by tags, weight decay and muP lr scale."""

from __future__ import annotations

import pytest
import torch

import cs_run.optim as csoptim


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(5, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.decoder = torch.nn.Linear(4, 3)
        self.frozen = torch.nn.Linear(3, 3)
        self.frozen.requires_grad_(False)


def _names(model, group):
    by_id = {id(p): n for n, p in model.named_parameters()}
    return sorted(by_id[id(p)] for p in group["params"])


def test_weight_decay_split_and_frozen_params():
    model = _Net()
    groups = csoptim.configure_param_groups(model, {"weight_decay": 0.1})
    assert [(g["weight_decay"], g["adjust_learning_rate"], _names(model, g)) for g in groups] == [
        (0.1, 1.0, ["decoder.weight", "embedding.weight"]),
        (0.0, 1.0, ["decoder.bias", "norm.bias", "norm.weight"]),
    ]
    opt = csoptim.AdamW(groups, lr=0.1)  # the groups feed an optimizer as they are
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_tags_and_lr_adjustment():
    model = _Net()
    groups = csoptim.configure_param_groups(model, {
        "weight_decay_rate": 0.01,
        "params": [{"params": "*decoder*", "tag": "head"}],
        "adjust_learning_rate": {"embedding": 0.5},
    })
    summary = sorted((sorted(g.get("tags", [])), g["weight_decay"], g["adjust_learning_rate"], _names(model, g))
                     for g in groups)
    assert summary == [
        ([], 0.0, 1.0, ["norm.bias", "norm.weight"]),
        ([], 0.01, 0.5, ["embedding.weight"]),
        (["head"], 0.0, 1.0, ["decoder.bias"]),
        (["head"], 0.01, 1.0, ["decoder.weight"]),
    ]
    opt = csoptim.SGD(groups, lr=1.0)
    sched = csoptim.lr_scheduler.ScalePerParamLR(opt, csoptim.lr_scheduler.ConstantLR(opt, 0.2))
    sched.step()
    by_scale = {g["adjust_learning_rate"]: float(g["lr"]) for g in opt.param_groups}
    assert by_scale == {1.0: pytest.approx(0.2), 0.5: pytest.approx(0.1)}


@pytest.mark.parametrize("params,regex", [
    ({"params": [{"params": "*nothing*", "tag": "x"}]}, r"tag 'x' with patterns '\*nothing\*' matches no parameter"),
    ({"params": [{"tag": "x"}]}, r"expected a mapping with 'params'"),
    ({"adjust_learning_rate": {"attention": 2.0}}, r"\['attention'\] match no LR adjustment group"),
])
def test_bad_optimizer_params(params, regex):
    with pytest.raises(ValueError, match=regex):
        csoptim.configure_param_groups(_Net(), params)
