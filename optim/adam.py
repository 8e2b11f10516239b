"""Adam and AdamW with the vendor's update rule and state (``beta1_power``/``beta2_power``, no ``step``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import zeros_like

from . import _docs
from .optimizer import Optimizer, ParamsT, _check, _check_betas, _run_closure

__all__ = ["Adam", "AdamBase", "AdamW"]


def _power(value: float, device: torch.device) -> Tensor:
    """A running ``beta^step`` in the default dtype (float32), as the vendor keeps it."""
    return torch.tensor(value, dtype=torch.get_default_dtype(), device=device)


class AdamBase(Optimizer):
    """Adam (Kingma & Ba, 2014) as the vendor computes it; :class:`Adam` and :class:`AdamW` set the decay.

    .. code-block:: text

        g = -grad if maximize else grad;  g += l2_regularization_rate * p
        m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
        v_max = max(v_max, v)                                   (amsgrad)
        u = m / (sqrt(v or v_max) + eps)
        u *= sqrt(1 - beta2_power) / (1 - beta1_power)          (correct_bias; then beta*_power *= beta*)
        p -= lr * (u + weight_decay * p)

    Differences from torch.optim.Adam/AdamW (the vendor's, kept so its runs and checkpoints continue
    here identically): ``eps`` is added to ``sqrt(v)`` *before* the bias correction (torch adds it to
    ``sqrt(v / (1 - beta2^t))``, i.e. the vendor's effective eps is ``eps * sqrt(1 - beta2^t)``);
    the bias corrections come from the float32 state ``beta1_power``/``beta2_power`` (``beta^t`` kept
    by repeated multiplication) instead of a ``step`` counter; the default ``eps`` is 1e-6 (torch:
    1e-8) and AdamW's default ``weight_decay`` is 0.0 (torch: 0.01). A torch.optim Adam/AdamW state
    dict (with ``step``) loads: ``beta^step`` is computed from it, as the vendor does.

    Args:
        {params}
        lr: learning rate (default: 1e-3).
        betas: coefficients of the running averages of the gradient and its square.
        eps: term added to ``sqrt(v)`` (default: 1e-6).
        weight_decay: decoupled weight decay, ``p -= lr * weight_decay * p`` (default: 0).
        l2_regularization_rate: L2 penalty added to the gradient (default: 0).
        correct_bias: apply the bias corrections (default: True; False is the BERT recipe).
        amsgrad: use the AMSGrad variant (default: False).
        {maximize}

    {compliant}
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        l2_regularization_rate: float = 0.0,
        correct_bias: bool = True,
        amsgrad: bool = False,
        maximize: bool = False,
    ) -> None:
        _check("learning rate", lr)
        _check_betas(betas)
        _check("epsilon value", eps)
        _check("weight_decay value", weight_decay)
        _check("l2_regularization_rate value", l2_regularization_rate)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                    "l2_regularization_rate": l2_regularization_rate, "correct_bias": correct_bias,
                    "amsgrad": amsgrad, "maximize": maximize}
        super().__init__(params, defaults)

    def preinitialize(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["exp_avg"] = zeros_like(p)
                state["exp_avg_sq"] = zeros_like(p)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = zeros_like(p)
                if group["correct_bias"]:
                    beta1, beta2 = group["betas"]
                    state["beta1_power"] = _power(beta1, p.device)  # beta1^1, for the first step
                    state["beta2_power"] = _power(beta2, p.device)

    def state_names_to_sparsify(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _run_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p, grad in self._params_with_grads(group):
                state = self.state[p]
                if group["l2_regularization_rate"] > 0.0:
                    grad = grad.add(p, alpha=group["l2_regularization_rate"])
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                second = exp_avg_sq
                if group["amsgrad"]:
                    torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
                    second = state["max_exp_avg_sq"]
                update = exp_avg / second.sqrt().add_(group["eps"])
                if group["correct_bias"]:
                    b1p, b2p = state["beta1_power"], state["beta2_power"]
                    update *= torch.sqrt(1.0 - b2p) / (1.0 - b1p)
                    b1p *= beta1
                    b2p *= beta2
                weight_decay = group["weight_decay"]
                if isinstance(weight_decay, torch.Tensor) or weight_decay != 0:  # skip adding exact zeros
                    update.add_(p * weight_decay)
                update *= group["lr"]
                p.sub_(update)
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Also loads a torch.optim/HuggingFace Adam(W) state: ``step`` becomes ``beta^step``."""
        for index, state in state_dict["state"].items():
            if "step" in state and "beta1_power" not in state:
                step = float(state.pop("step"))
                group = next((g for g in state_dict["param_groups"] if index in g["params"]), None)
                if group is not None and group.get("correct_bias", True):
                    beta1, beta2 = group["betas"]
                    state["beta1_power"] = torch.tensor(beta1**(step + 1), dtype=torch.float32)
                    state["beta2_power"] = torch.tensor(beta2**(step + 1), dtype=torch.float32)
        super().load_state_dict(state_dict)


class AdamW(AdamBase):
    """AdamW (Loshchilov & Hutter, 2019): Adam with decoupled weight decay; see :class:`AdamBase`.

    The decay is ``p -= lr * weight_decay * p`` applied with the update (the vendor's order; equal
    to torch's ``p *= 1 - lr * weight_decay`` up to rounding).
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        correct_bias: bool = True,
        amsgrad: bool = False,
        maximize: bool = False,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, l2_regularization_rate=0.0,
                         correct_bias=correct_bias, amsgrad=amsgrad, maximize=maximize)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for group in state_dict["param_groups"]:
            group["l2_regularization_rate"] = 0.0
            group.setdefault("correct_bias", True)
        super().load_state_dict(state_dict)


class Adam(AdamBase):
    """Adam with L2 regularization: ``weight_decay`` is stored as the group's ``l2_regularization_rate``.

    As the vendor does, the group's own ``weight_decay`` is 0.0; a torch.optim.Adam state dict (its
    ``weight_decay`` is the L2 rate) loads with that mapping. ``correct_bias`` (cs-run's older argument,
    kept) defaults to True; the vendor's Adam always corrects.
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        maximize: bool = False,
        correct_bias: bool = True,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=0.0, l2_regularization_rate=weight_decay,
                         correct_bias=correct_bias, amsgrad=amsgrad, maximize=maximize)

    @staticmethod
    def _l2_from_weight_decay(groups: list[dict[str, Any]]) -> None:
        for group in groups:
            group.setdefault("l2_regularization_rate", group.pop("weight_decay", 0.0))
            group["weight_decay"] = 0.0
            group.setdefault("correct_bias", True)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """A group's own ``weight_decay`` means L2 here, as in the constructor."""
        if "weight_decay" in param_group and "l2_regularization_rate" not in param_group:
            param_group = dict(param_group)
            self._l2_from_weight_decay([param_group])
        super().add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._l2_from_weight_decay(state_dict["param_groups"])
        super().load_state_dict(state_dict)


AdamBase.__doc__ = _docs.fill(AdamBase.__doc__)
