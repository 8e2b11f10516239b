"""Adam and AdamW with the vendor's update rule and state (``beta1_power``/``beta2_power``, no ``step``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cs_run.creation import zeros_like

from . import _docs
from ._functional import foreach_mul
from .optimizer import ParamsT, _checked_defaults, _CoreOptimizer

__all__ = ["Adam", "AdamBase", "AdamW", "adam"]


def _power(value: float, device: torch.device) -> Tensor:
    """A running ``beta^step`` in the default dtype (float32), as the vendor keeps it."""
    return torch.tensor(value, dtype=torch.get_default_dtype(), device=device)


class AdamBase(_CoreOptimizer):
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

    _weight_decay_is_l2: bool | None = None
    """What a ``weight_decay`` means: True (:class:`Adam`) an L2 rate, stored as the group's
    ``l2_regularization_rate`` with its own ``weight_decay`` 0.0, as the vendor stores it; False
    (:class:`AdamW`) the decoupled decay, with no L2; None (this class) each as given."""

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
        if self._weight_decay_is_l2:
            weight_decay, l2_regularization_rate = 0.0, weight_decay
        elif self._weight_decay_is_l2 is False:
            l2_regularization_rate = 0.0
        super().__init__(params, _checked_defaults(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, l2_regularization_rate=l2_regularization_rate,
            correct_bias=correct_bias, amsgrad=amsgrad, maximize=maximize))

    def _vendor_groups(self, groups: list[dict[str, Any]]) -> None:
        """Param groups (a new one's, or a state dict's: the vendor's or torch.optim's) in this class's
        form: ``weight_decay`` per :attr:`_weight_decay_is_l2`, ``correct_bias`` True where absent."""
        for group in groups:
            if self._weight_decay_is_l2:
                group.setdefault("l2_regularization_rate", group.pop("weight_decay", 0.0))
                group["weight_decay"] = 0.0
            elif self._weight_decay_is_l2 is False:
                group["l2_regularization_rate"] = 0.0
            group.setdefault("correct_bias", True)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """An Adam group's own ``weight_decay`` means L2, as in the constructor."""
        if self._weight_decay_is_l2 and "weight_decay" in param_group and "l2_regularization_rate" not in param_group:
            param_group = dict(param_group)
            self._vendor_groups([param_group])
        super().add_param_group(param_group)

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

    def _step_group(self, group: dict[str, Any]) -> None:
        """The rule above, one multi-tensor (``torch._foreach_*``) op per line over a chunk of params.

        Each foreach op computes, tensor by tensor, exactly the per-tensor op it replaces (same ops, same
        order, same dtypes), so the result is bit-identical to a per-parameter loop; it just makes a
        dozen calls per chunk instead of a dozen per parameter (docs/architecture.md#optimizers).
        """
        names = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])
        names += ["beta1_power", "beta2_power"] if group["correct_bias"] else []
        for params, grads, *lists in self._foreach_chunks(group, *names):
            state = dict(zip(names, lists))
            adam(params, grads, state["exp_avg"], state["exp_avg_sq"], state.get("max_exp_avg_sq"),
                 state.get("beta1_power"), state.get("beta2_power"), lr=group["lr"], betas=group["betas"],
                 eps=group["eps"], weight_decay=group["weight_decay"],
                 l2_regularization_rate=group["l2_regularization_rate"])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Also loads a torch.optim/HuggingFace Adam(W) state: ``step`` becomes ``beta^step``; the groups
        are read as :meth:`_vendor_groups` says."""
        if self._weight_decay_is_l2 is not None:
            self._vendor_groups(state_dict["param_groups"])
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

    _weight_decay_is_l2 = False

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
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, correct_bias=correct_bias,
                         amsgrad=amsgrad, maximize=maximize)


class Adam(AdamBase):
    """Adam with L2 regularization: ``weight_decay`` is stored as the group's ``l2_regularization_rate``.

    As the vendor does, the group's own ``weight_decay`` is 0.0; a torch.optim.Adam state dict (its
    ``weight_decay`` is the L2 rate) loads with that mapping. ``correct_bias`` (cs-run's older argument,
    kept) defaults to True; the vendor's Adam always corrects.
    """

    _weight_decay_is_l2 = True

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
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, correct_bias=correct_bias,
                         amsgrad=amsgrad, maximize=maximize)


AdamBase.__doc__ = _docs.fill(AdamBase.__doc__)


def adam(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
         max_exp_avg_sqs: list[Tensor] | None, beta1_powers: list[Tensor] | None, beta2_powers: list[Tensor] | None,
         *, lr: Tensor, betas: tuple[float, float], eps: float, weight_decay: Any, l2_regularization_rate: float) -> None:
    """Functional Adam / AdamW over one chunk of params (multi-tensor ops); see :class:`AdamBase`.

    ``max_exp_avg_sqs`` is None without amsgrad, ``beta*_powers`` None without ``correct_bias``. Mutates
    params and state in place.
    """
    beta1, beta2 = betas
    if l2_regularization_rate > 0.0:
        grads = torch._foreach_add(grads, params, alpha=l2_regularization_rate)
    foreach_mul(exp_avgs, beta1, inplace=True)
    torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
    foreach_mul(exp_avg_sqs, beta2, inplace=True)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    second = exp_avg_sqs
    if max_exp_avg_sqs is not None:
        second = max_exp_avg_sqs
        torch._foreach_maximum_(second, exp_avg_sqs)
    denom = torch._foreach_sqrt(second)
    torch._foreach_add_(denom, eps)
    updates = torch._foreach_div(exp_avgs, denom)
    if beta1_powers is not None and beta2_powers is not None:
        # sqrt(1 - b2p) / (1 - b1p): -x + 1 rounds exactly as 1 - x
        numer = torch._foreach_neg(beta2_powers)
        torch._foreach_add_(numer, 1.0)
        torch._foreach_sqrt_(numer)
        below = torch._foreach_neg(beta1_powers)
        torch._foreach_add_(below, 1.0)
        torch._foreach_mul_(updates, torch._foreach_div(numer, below))
        torch._foreach_mul_(beta1_powers, beta1)
        torch._foreach_mul_(beta2_powers, beta2)
    if isinstance(weight_decay, Tensor) or weight_decay != 0:  # skip adding exact zeros
        torch._foreach_add_(updates, foreach_mul(params, weight_decay))
    torch._foreach_mul_(updates, lr)
    torch._foreach_sub_(params, updates)
