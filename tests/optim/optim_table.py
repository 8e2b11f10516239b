"""One row per optimizer: the class, its torch.optim twin or paper reference, hyper-parameter
variants, bad arguments with the expected error, and the tolerance of the comparison.

cs_run.optim reproduces the vendor's optimizers (cerebras-pytorch 2.10). Where the vendor's rule is
torch's, the variant is compared with its torch.optim twin (or paper reference) in float64, where the only
differences left are the order of floating-point operations and the vendor's float32 scalar state
(``beta1_power``, ``step``, ``eta``): ``atol`` is the largest absolute parameter difference allowed after
50 steps (parameters are O(1)). Where the vendor's rule differs from torch's (``vendor_rule``: the variant
indices and why), the twin comparison is replaced by the vendor's golden trajectories
(tests/optim/test_vendor_oracle.py), and the difference is asserted to be real here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import cs_run.optim as csoptim
from tests.optim import references


@dataclass(frozen=True)
class Row:
    cls: type
    twin: Callable[..., Any] | None  # torch.optim class or paper reference class, same kwargs
    variants: list[dict[str, Any]]
    bad: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    twin_defaults: dict[str, Any] = field(default_factory=dict)  # vendor defaults torch lacks
    atol: float = 1e-13
    vendor_rule: dict[int, str] = field(default_factory=dict)  # variant index -> how the vendor differs

    @property
    def name(self) -> str:
        return self.cls.__name__


ROWS = [
    Row(csoptim.SGD, torch.optim.SGD,
        [{"lr": 0.05}, {"lr": 0.05, "momentum": 0.9}, {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
         {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "maximize": True}],
        [({"lr": -1.0}, r"Invalid learning rate: -1.0 \(must be >= 0"),
         ({"lr": 0.1, "nesterov": True}, r"Invalid nesterov")], atol=1e-15,
        vendor_rule={3: "momentum buffer starts at zero, so the first step is damped"}),
    Row(csoptim.Adam, torch.optim.Adam,
        [{"lr": 0.01}, {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True}, {"lr": 0.01, "betas": (0.8, 0.99), "maximize": True}],
        [({"betas": (1.0, 0.9)}, r"Invalid beta at index 0: 1.0 \(must be in \[0.0, 1.0\)\)"),
         ({"eps": -1e-3}, r"Invalid epsilon value")], twin_defaults={"eps": 1e-6},
        vendor_rule=dict.fromkeys(range(3), "eps added to sqrt(v) before the bias correction")),
    Row(csoptim.AdamW, torch.optim.AdamW,
        [{"lr": 0.01}, {"lr": 0.01, "weight_decay": 0.1}, {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True, "maximize": True}],
        [({"betas": (0.9, 1.5)}, r"Invalid beta at index 1"), ({"weight_decay": -1}, r"Invalid weight_decay")],
        twin_defaults={"eps": 1e-6, "weight_decay": 0.0},
        vendor_rule=dict.fromkeys(range(3), "eps added to sqrt(v) before the bias correction")),
    Row(csoptim.Adamax, torch.optim.Adamax,
        [{"lr": 0.01}, {"lr": 0.01, "weight_decay": 0.1, "maximize": True}], [({"eps": -1.0}, r"Invalid epsilon")],
        twin_defaults={"eps": 1e-6}, atol=1e-7),  # float32 beta1_power, as the vendor's
    Row(csoptim.Adadelta, torch.optim.Adadelta,
        [{"lr": 0.5}, {"lr": 0.5, "rho": 0.8, "weight_decay": 0.1, "maximize": True}], [({"rho": 1.5}, r"Invalid rho")]),
    Row(csoptim.Adagrad, torch.optim.Adagrad,
        [{"lr": 0.1}, {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1, "initial_accumulator_value": 0.1, "maximize": True}],
        [({"lr_decay": -1}, r"Invalid lr_decay")], twin_defaults={"eps": 1e-6}, atol=1e-7),  # float32 step
    Row(csoptim.ASGD, torch.optim.ASGD,
        [{"lr": 0.05}, {"lr": 0.05, "t0": 10, "lambd": 1e-3, "weight_decay": 0.1, "maximize": True}],
        [({"alpha": -1}, r"Invalid alpha")], atol=1e-6),  # float32 eta, mu and step
    Row(csoptim.NAdam, torch.optim.NAdam,
        [{"lr": 0.01}, {"lr": 0.01, "weight_decay": 0.1, "maximize": True},
         {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}],
        [({"momentum_decay": -1}, r"Invalid momentum_decay")],
        vendor_rule=dict.fromkeys(range(3), "mu_product_next = mu_product * mu * mu_next (mu counted twice)")),
    Row(csoptim.RAdam, torch.optim.RAdam,
        [{"lr": 0.01}, {"lr": 0.01, "weight_decay": 0.1, "maximize": True},
         {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True}],
        [({"betas": (0.9,)}, r"Invalid betas")], twin_defaults={"eps": 1e-6},
        atol=2e-6),  # float32 beta^t and rho terms, as the vendor's
    Row(csoptim.RMSprop, torch.optim.RMSprop,
        [{"lr": 0.01}, {"lr": 0.01, "momentum": 0.9, "centered": True},
         {"lr": 0.01, "alpha": 0.9, "weight_decay": 0.1, "centered": True, "maximize": True}],
        [({"momentum": -0.5}, r"Invalid momentum")]),
    Row(csoptim.Rprop, torch.optim.Rprop,
        [{"lr": 0.01}, {"lr": 0.01, "etas": (0.3, 1.5), "step_sizes": (1e-3, 0.2), "maximize": True}],
        [({"etas": (1.5, 1.2)}, r"Invalid eta values")], atol=1e-6),  # etas rounded to float32
    Row(csoptim.Lamb, references.PaperLamb,
        [{"lr": 0.01}, {"lr": 0.01, "weight_decay": 0.1}, {"lr": 0.01, "adam": True, "maximize": True}],
        [({"betas": (-0.1, 0.9)}, r"Invalid beta at index 0")],
        vendor_rule=dict.fromkeys(range(3), "no bias correction and ||p|| clamped to 10 (pytorch-lamb)")),
    Row(csoptim.Lion, references.PaperLion,
        [{"lr": 1e-3}, {"lr": 1e-3, "betas": (0.95, 0.98), "weight_decay": 0.5, "maximize": True}],
        [({"weight_decay": -0.1}, r"Invalid weight_decay")], atol=1e-12),
    Row(csoptim.Adafactor, references.PaperAdafactor,
        [{"lr": 0.01}, {"lr": 0.01, "beta1": 0.9, "weight_decay": 0.01, "clip_threshold": 0.5},
         {"lr": None, "relative_step": True, "warmup_init": True, "scale_parameter": False},
         {"lr": None, "relative_step": True, "decay_rate": -0.5}],
        [({"lr": 0.1, "warmup_init": True}, r"Invalid warmup_init"), ({"lr": 0.1, "decay_rate": 0.5}, r"Invalid decay_rate"),
         ({"lr": None}, r"Invalid learning rate: None")],
        atol=1e-7),  # beta2_t from the float32 step, as the vendor
]

ROW_BY_NAME = {row.name: row for row in ROWS}
CASES = [(row, variant) for row in ROWS for variant in row.variants]
TWIN_CASES = [(row, variant) for row in ROWS for i, variant in enumerate(row.variants) if i not in row.vendor_rule]
VENDOR_RULE_CASES = [(row, variant) for row in ROWS for i, variant in enumerate(row.variants) if i in row.vendor_rule]


def case_id(case: tuple[Row, dict[str, Any]]) -> str:
    row, variant = case
    return row.name + "-" + ",".join(f"{k}={v}" for k, v in variant.items())
