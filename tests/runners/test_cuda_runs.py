"""The runners' CUDA paths end to end on a real GPU: fp16 with dynamic loss scaling (eager and CSX) against
fp32, ``sharding: fsdp`` + ``offload: cpu`` on one GPU against the unsharded run, and no host sync inside
the GPU runner's steps (the host prepares the next batch while the device runs the step).

Marked ``cuda``: skipped in the default (CPU) suite; on a GPU machine ``CS_RUN_TEST_CUDA=1 pytest -m cuda``.
The CPU side of each rule is tested elsewhere (test_cs_runner.py's deferred NaN check, tests/parallel).

Tolerances, all relative to the fp32 eager loss of the same step:
* fp16 vs fp32 over 50 steps: 2e-2. fp16 keeps 11 significant bits (a rounding of 5e-4 per operation);
  autocast keeps the softmax and the loss in fp32, and 50 AdamW steps at 3e-4 let the rounding in the
  weights' updates add up. A broken scaler (a skipped step, an update not unscaled) is off by far more.
* CSX (fx tier) vs eager, both fp16: 1e-3. The fx tier replays eager's aten kernels; cuBLAS may pick
  other algorithms from a traced context. The inductor tier: 2e-2 against fp32, as eager fp16.
* fsdp + offload vs unsharded, fp32: 1e-4 over 10 steps. The optimizer step runs on the CPU's kernels
  instead of the GPU's (ULPs apart), and FSDP2 reduces gradients in another order.
"""

from __future__ import annotations

import pytest
import torch

import cs_run as cstorch
from cs_run.backend import _reset_for_tests
from cs_run.runners import PyTorchBaseRunner

pytestmark = pytest.mark.cuda

GPT2 = {"name": "gpt2", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4,
        "filter_size": 256, "max_position_embeddings": 64, "dropout_rate": 0.0, "attention_dropout_rate": 0.0}
LLAMA = {"name": "llama", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 2, "num_heads": 4,
         "filter_size": 128, "max_position_embeddings": 64, "position_embedding_type": "rotary", "rotary_dim": 16,
         "norm_type": "rmsnorm", "nonlinearity": "swiglu", "attention_module": "multiquery_attention",
         "extra_attention_params": {"num_kv_groups": 2}, "use_bias_in_output": False, "dropout_rate": 0.0}
_SEEN: dict = {}


class _Recorder(PyTorchBaseRunner):
    """Each step's loss (kept on the device); ``_SEEN["no_sync"]`` turns CUDA's sync check to error
    between the start of step 3 and the end of the step before the last."""

    def on_train_batch_start(self, data):
        if _SEEN.get("no_sync") and self.global_step == 2:
            torch.cuda.set_sync_debug_mode("error")
        return super().on_train_batch_start(data)

    def on_train_batch_end(self, loss, epoch=None, step=None):
        super().on_train_batch_end(loss, epoch, step)
        if _SEEN.get("no_sync") and step == _SEEN["steps"] - 1:
            torch.cuda.set_sync_debug_mode("default")
        _SEEN["losses"].append(loss.detach().float().clone())


def _batches(vocab: int, count: int, batch: int = 4, seq: int = 32):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (count, batch, seq + 1), generator=g)
    return [{"input_ids": x[:, :-1].contiguous(), "labels": x[:, 1:].contiguous(),
             "attention_mask": torch.ones(batch, seq, dtype=torch.int32)} for x in ids]


def _fit(tmp_path, name: str, model: dict, steps: int, device: str = "GPU", precision=None, no_sync=False,
         tier: str = "fx", **kwargs) -> list[float]:
    _SEEN.update(losses=[], steps=steps, no_sync=no_sync)
    backend = {"backend_type": device, **({"compile_tier": tier} if device == "CSX" else {})}
    loader = torch.utils.data.DataLoader(_batches(model["vocab_size"], steps), batch_size=None, pin_memory=True)
    try:
        with _reset_for_tests():
            cstorch.Trainer(backend=backend, model_dir=str(tmp_path / name), model=dict(model),
                            optimizer={"optimizer_type": "AdamW", "learning_rate": 3e-4},
                            precision=precision or {"mixed_precision": False}, loop={"num_steps": steps},
                            logging={"log_steps": steps}, seed=0, runner=_Recorder, **kwargs).fit(loader)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [float(x) for x in _SEEN["losses"]]


def _max_rel(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def test_fp16_dynamic_loss_scaling_on_gpu_and_csx_follows_fp32(tmp_path, caplog):
    """On CSX the step with the loss scaler replays as one CUDA graph: the scaler's state is on the GPU
    from the start (an H200 run of 2026-11-27 found it on the host: a graph input on cpu, no graph)."""
    fp16 = {"mixed_precision": True, "fp16_type": "float16", "loss_scaling_factor": "dynamic"}
    fp32 = _fit(tmp_path, "fp32", GPT2, 50)
    eager = _fit(tmp_path, "eager16", GPT2, 50, precision=fp16)
    caplog.set_level("INFO")
    csx = _fit(tmp_path, "csx16", GPT2, 50, device="CSX", precision=fp16)
    assert "no CUDA graph" not in caplog.text
    assert _max_rel(eager, fp32) < 2e-2, (eager, fp32)
    assert _max_rel(csx, eager) < 1e-3, (csx, eager)
    assert fp32[-1] < fp32[0] and eager[-1] < eager[0]  # it trained: 50 different batches, loss went down


def test_fp16_dynamic_loss_scaling_on_the_csx_inductor_tier_follows_fp32(tmp_path, caplog):
    """The inductor tier's Triton kernels (the multi-tensor unscale and clipping among them) with the
    scaler, replayed as one CUDA graph: within fp16's tolerance of fp32 (kernels fused and summed in
    inductor's order, so not compared to eager fp16 within 1e-3 as the fx tier is)."""
    fp16 = {"mixed_precision": True, "fp16_type": "float16", "loss_scaling_factor": "dynamic"}
    fp32 = _fit(tmp_path, "fp32", GPT2, 50)
    caplog.set_level("INFO")
    csx = _fit(tmp_path, "csx16-inductor", GPT2, 50, device="CSX", precision=fp16, tier="inductor")
    assert "no CUDA graph" not in caplog.text
    assert _max_rel(csx, fp32) < 2e-2, (csx, fp32)
    assert csx[-1] < csx[0]


def test_fsdp_with_cpu_offload_on_one_gpu_matches_the_unsharded_run(tmp_path):
    whole = _fit(tmp_path, "whole", LLAMA, 10)
    offloaded = _fit(tmp_path, "offload", LLAMA, 10, sharding="fsdp", offload="cpu")
    assert _max_rel(offloaded, whole) < 1e-4, (offloaded, whole)


def test_the_gpu_runner_never_waits_for_the_device_inside_its_steps(tmp_path):
    """No host sync between step 3 and step 9 (CUDA's sync check raises on one): the loss is checked on
    the device, and the next batch's copy from pinned memory does not wait."""
    losses = _fit(tmp_path, "async", GPT2, 10, no_sync=True)
    assert len(losses) == 10
