"""Reference optimizers written from the papers, as plainly as possible (lazy state, Python scalars).

They are deliberately *not* compliant: they exist to check cs_run.optim's Lamb, Lion and Adafactor.
"""

from __future__ import annotations

import math

import torch


class _Reference(torch.optim.Optimizer):
    def __init__(self, params, **defaults):
        super().__init__(params, defaults)

    def _grad(self, group, p):
        return -p.grad if group.get("maximize", False) else p.grad


class PaperLion(_Reference):
    """Chen et al. 2023, Algorithm 2 (Lion), with decoupled weight decay lambda."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, maximize=False):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay, maximize=maximize)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                g = self._grad(group, p)
                m = self.state[p].setdefault("m", torch.zeros_like(p))
                c = beta1 * m + (1 - beta1) * g
                p.copy_(p - group["lr"] * (torch.sign(c) + group["weight_decay"] * p))
                m.copy_(beta2 * m + (1 - beta2) * g)


class PaperLamb(_Reference):
    """You et al. 2020, Algorithm 2 (LAMB) with phi = identity; ``adam`` forces the trust ratio to 1."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, adam=False, maximize=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adam=adam, maximize=maximize)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                g = self._grad(group, p)
                state = self.state[p]
                t = state["t"] = state.get("t", 0) + 1
                m = state["m"] = beta1 * state.get("m", torch.zeros_like(p)) + (1 - beta1) * g
                v = state["v"] = beta2 * state.get("v", torch.zeros_like(p)) + (1 - beta2) * g * g
                r = (m / (1 - beta1**t)) / (torch.sqrt(v / (1 - beta2**t)) + group["eps"])
                r = r + group["weight_decay"] * p
                x_norm, r_norm = float(p.norm()), float(r.norm())
                ratio = 1.0 if group["adam"] or x_norm == 0 or r_norm == 0 else x_norm / r_norm
                p.copy_(p - group["lr"] * ratio * r)


class PaperAdafactor(_Reference):
    """Shazeer & Stern 2018, Algorithms 4/5 with update clipping (d), relative step size rho_t, parameter
    scale alpha_t = max(eps2, RMS(X)) rho_t, and the Model Zoo extras (beta1 on the scaled update,
    decoupled weight decay scaled by alpha_t). Factored second moments kept as row and column *sums*."""

    def __init__(self, params, lr=1e-3, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8, beta1=None,
                 weight_decay=0.0, scale_parameter=True, relative_step=False, warmup_init=False):
        super().__init__(params, lr=lr, eps=eps, d=clip_threshold, decay_rate=decay_rate, beta1=beta1,
                         weight_decay=weight_decay, scale_parameter=scale_parameter, relative_step=relative_step,
                         warmup_init=warmup_init)

    @staticmethod
    def _rms(x):
        return math.sqrt(float((x * x).mean()))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            eps1, eps2 = group["eps"]
            for p in group["params"]:
                g, state = p.grad, self.state[p]
                t = state["t"] = state.get("t", 0) + 1
                if group["relative_step"]:
                    rho = min(1e-6 * t if group["warmup_init"] else 1e-2, 1 / math.sqrt(t))
                else:
                    rho = group["lr"]
                alpha = max(eps2, self._rms(p)) * rho if group["scale_parameter"] else rho
                beta2_hat = 1 - t ** group["decay_rate"]
                g2 = g * g + eps1
                if p.dim() >= 2:
                    R = state["R"] = beta2_hat * state.get("R", 0.0) + (1 - beta2_hat) * g2.sum(-1)  # row sums
                    C = state["C"] = beta2_hat * state.get("C", 0.0) + (1 - beta2_hat) * g2.sum(-2)  # col sums
                    v_hat = R.unsqueeze(-1) * C.unsqueeze(-2) / R.sum(-1, keepdim=True).unsqueeze(-1)  # R C / 1^T R
                else:
                    v_hat = state["V"] = beta2_hat * state.get("V", 0.0) + (1 - beta2_hat) * g2
                u = g / torch.sqrt(v_hat)
                u_hat = u / max(1.0, self._rms(u) / group["d"])
                update = alpha * u_hat
                if group["beta1"] is not None:
                    update = state["M"] = group["beta1"] * state.get("M", 0.0) + (1 - group["beta1"]) * update
                p.copy_(p - group["weight_decay"] * alpha * p - update)
