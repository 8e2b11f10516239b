"""The multi-tensor (foreach) steps of SGD and Adam/AdamW are bit-identical to the vendor's rule written as
a plain per-parameter loop (the form the golden files were checked against), over the options' cross
product, mixed dtypes, params without grads, several groups, a tensor lr that changes and a scheduled
(tensor) weight decay."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

import cs_run.optim as csoptim
from cs_run.optim import optimizer as optimizer_module


@pytest.fixture(params=["one chunk", "small chunks"])
def chunking(request, monkeypatch):
    """The default chunk size (these params fit one chunk) and 48-byte chunks (several per group)."""
    if request.param == "small chunks":
        monkeypatch.setattr(optimizer_module, "FOREACH_CHUNK_BYTES", 48)
    return request.param


@torch.no_grad()
def loop_sgd_step(opt):
    for group in opt.param_groups:
        momentum, lr = group["momentum"], group["lr"]
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = -p.grad if group["maximize"] else p.grad
            wd = group["weight_decay"]
            if isinstance(wd, torch.Tensor) or wd != 0:
                grad = grad + p * wd
            if momentum != 0:
                buf = opt.state[p]["momentum_buffer"]
                buf.mul_(momentum).add_(grad, alpha=1.0 - group["dampening"])
                grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
            p.add_(-lr * grad)


@torch.no_grad()
def loop_adam_step(opt):
    for group in opt.param_groups:
        beta1, beta2 = group["betas"]
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = -p.grad if group["maximize"] else p.grad
            state = opt.state[p]
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
            wd = group["weight_decay"]
            if isinstance(wd, torch.Tensor) or wd != 0:
                update.add_(p * wd)
            update *= group["lr"]
            p.sub_(update)


def _params(dtypes):
    g = torch.Generator().manual_seed(7)
    shapes = [(5, 3), (3,), (), (4, 2, 2), (1,)]
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dt)) for s, dt in zip(shapes, itertools.cycle(dtypes))]


def _run(make, loop_step, dtypes, groups=1, steps=8, tensor_wd=False):
    params = _params(dtypes)
    twin = copy.deepcopy(params)

    def build(ps):
        chunks = [ps[i::groups] for i in range(groups)]
        return make([{"params": c} for c in chunks])

    ours, ref = build(params), build(twin)
    if tensor_wd:  # what WeightDecayScheduler leaves in the group: a 0-d tensor
        for o in (ours, ref):
            for grp in o.param_groups:
                grp["weight_decay"] = torch.tensor(0.03)
    g = torch.Generator().manual_seed(11)
    for step in range(steps):
        for i, (p, q) in enumerate(zip(params, twin)):
            grad = None if (i == 2 and step % 3 == 0) else torch.randn(p.shape, generator=g).to(p.dtype)
            p.grad, q.grad = grad, None if grad is None else grad.clone()
        for o in (ours, ref):
            for grp in o.param_groups:
                grp["lr"].fill_(0.05 / (step + 1))
        ours.step()
        loop_step(ref)
        for p, q in zip(params, twin):
            assert torch.equal(p, q), (step, p.dtype)
        for a, b in zip(ours.state.values(), ref.state.values()):
            for k in a:
                assert torch.equal(a[k], b[k]), (step, k)


DTYPES = [(torch.float32,), (torch.float64,), (torch.float32, torch.bfloat16, torch.float16)]


@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: "+".join(str(x)[6:] for x in d))
@pytest.mark.parametrize("amsgrad,correct_bias,maximize", list(itertools.product([False, True], repeat=3)))
@pytest.mark.parametrize("decay", ["none", "l2", "decoupled", "tensor"])
def test_adam_foreach_step_is_bit_identical_to_the_loop(dtypes, amsgrad, correct_bias, maximize, decay, chunking):
    def make(groups):
        kw = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, amsgrad=amsgrad, correct_bias=correct_bias,
                  maximize=maximize)
        if decay == "l2":
            return csoptim.Adam(groups, weight_decay=0.1, **kw)
        return csoptim.AdamW(groups, weight_decay=0.1 if decay == "decoupled" else 0.0, **kw)

    _run(make, loop_adam_step, dtypes, groups=2, tensor_wd=decay == "tensor")


@pytest.mark.parametrize("dtypes", DTYPES, ids=lambda d: "+".join(str(x)[6:] for x in d))
@pytest.mark.parametrize("momentum,dampening,nesterov", [(0.0, 0.0, False), (0.9, 0.0, False), (0.9, 0.2, False),
                                                         (0.9, 0.0, True)])
@pytest.mark.parametrize("decay", ["none", "float", "tensor"])
@pytest.mark.parametrize("maximize", [False, True])
def test_sgd_foreach_step_is_bit_identical_to_the_loop(dtypes, momentum, dampening, nesterov, decay, maximize,
                                                      chunking):
    def make(groups):
        return csoptim.SGD(groups, lr=0.01, momentum=momentum, dampening=dampening, nesterov=nesterov,
                           weight_decay=0.02 if decay == "float" else 0.0, maximize=maximize)

    _run(make, loop_sgd_step, dtypes, groups=2, tensor_wd=decay == "tensor")


@pytest.mark.parametrize("limit", [1, 4, 48, 100, 1 << 20])
def test_foreach_chunks_partition_the_params_in_order_within_the_limit(limit, monkeypatch):
    monkeypatch.setattr(optimizer_module, "FOREACH_CHUNK_BYTES", limit)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 20, 1, 1, 7, 2)]
    for p in params:
        p.grad = torch.ones_like(p)
    params[3].grad = None  # skipped, as torch.optim does
    opt = csoptim.SGD(params, lr=0.1, momentum=0.9)
    chunks = list(opt._foreach_chunks(opt.param_groups[0], "momentum_buffer"))
    flat = [p for ps, *_ in chunks for p in ps]
    assert flat == [p for p in params if p.grad is not None]
    for ps, grads, bufs in chunks:
        assert ps and len(ps) == len(grads) == len(bufs)
        assert len(ps) == 1 or sum(p.numel() * 4 for p in ps) <= limit
        assert all(b is opt.state[p]["momentum_buffer"] and g is p.grad for p, g, b in zip(ps, grads, bufs))
    if limit >= 1 << 20:
        assert len(chunks) == 1
    opt.param_groups[0]["params"] = []
    assert list(opt._foreach_chunks(opt.param_groups[0])) == []


def test_off_the_cpu_a_group_is_one_foreach_chunk(monkeypatch):
    """The chunks are for CPU caches; on an accelerator (here the meta device, as a GPU decides it) every
    op covers the whole group."""
    monkeypatch.setattr(optimizer_module, "FOREACH_CHUNK_BYTES", 4)
    params = [torch.nn.Parameter(torch.zeros(n, device="meta")) for n in (3, 20, 1, 7)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = csoptim.AdamW(params, lr=0.1)
    chunks = list(opt._foreach_chunks(opt.param_groups[0], "exp_avg"))
    assert len(chunks) == 1 and chunks[0][0] == params
