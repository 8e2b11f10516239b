"""Shared by the sharding tests: a tiny Llama-style params file on :mod:`tokens_data`, runs of it in-process
(one replica) and as launched replicas under ``timeout -s KILL`` (a hang fails, it never blocks the
suite), and the checkpoint and loss comparisons.

Tolerance (float32): N replicas each average the gradient over their B/N samples and FSDP2 averages the
N results (a reduce-scatter), one process averages over B at once: the same sum in another order, so the
rounding (~6e-8 relative per operation) differs, and AdamW's division by sqrt(v) and 30 steps compound it.
Observed (the Llama-style model, 2 and 4 replicas): <= 1.2e-7 on weights of magnitude <= ~1.0, losses
within 6e-7; allowed: atol 2e-6 + rtol 1e-5.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

import cs_run as cstorch
from cs_run.frontends.cli import cli

HARD_LIMIT = 240  # seconds for one launched run
ATOL, RTOL = 2e-6, 1e-5
STEPS = 30
# A Llama-style decoder of the families (GQA with 2 kv groups, rotary, RMSNorm, SwiGLU, untied head).
MODEL = dict(name="llama", vocab_size=64, hidden_size=32, num_hidden_layers=2, num_heads=4, filter_size=64,
             max_position_embeddings=16, position_embedding_type="rotary", rotary_dim=8, norm_type="rmsnorm",
             nonlinearity="swiglu", attention_module="multiquery_attention", extra_attention_params={"num_kv_groups": 2},
             share_embedding_weights=False, dropout_rate=0.0, attention_dropout_rate=0.0, embedding_dropout_rate=0.0)
# AdamW, clipping by norm, linear warmup from 0 then cosine decay: a Model Zoo GPT optimizer block.
OPTIMIZER = {"optimizer_type": "AdamW", "max_gradient_norm": 0.5, "weight_decay": 0.01, "learning_rate": [
    {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 2e-3, "total_iters": 5},
    {"scheduler": "CosineDecay", "initial_learning_rate": 2e-3, "end_learning_rate": 1e-4, "total_iters": 25}]}


def write_params(path: Path, grad_accum_steps: int = 1, **runconfig) -> Path:
    """The params file: global batch 8 (divides over 1, 2 and 4 replicas), 30 steps, every loss logged."""
    data = {"data_fn": "tokens_data:build", "batch_size": 8}
    optimizer = {**OPTIMIZER, "grad_accum_steps": grad_accum_steps}
    params = {"train_input": dict(data), "eval_input": dict(data), "model": MODEL, "optimizer": optimizer,
              "runconfig": {"max_steps": STEPS, "log_steps": 1, "seed": 1, "disable_progress_bar": True,
                            "python_paths": [str(Path(__file__).parent)], **runconfig}}
    path.write_text(yaml.safe_dump(params))
    return path


def train_here(params: Path, model_dir: Path, *args, command: str = "train") -> str:
    """One replica in this process; returns its output."""
    result = CliRunner().invoke(cli, [command, "--params", str(params), "--model_dir", str(model_dir),
                                      *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.output


def launch(params: Path, model_dir: Path, *args, command: str = "train", check: bool = True) -> subprocess.CompletedProcess:
    """``cs-run <command>`` as its own process (it launches its replicas), killed after HARD_LIMIT seconds;
    it must succeed unless ``check`` is False."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    line = ["timeout", "-s", "KILL", str(HARD_LIMIT), sys.executable, "-m", "cs_run.frontends.cli", command, "--params",
               str(params), "--model_dir", str(model_dir), "--collective_timeout", "120", *map(str, args)]
    try:
        result = subprocess.run(line, capture_output=True, text=True, env=env, timeout=HARD_LIMIT + 30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{line} did not finish within {HARD_LIMIT} s (a hang)")
    assert result.returncode == 0 or not check, result.stderr[-3000:]
    return result


def tensors(path: Path) -> dict[str, torch.Tensor]:
    """The weights and optimizer state of a checkpoint, flat."""
    state = cstorch.load(path)
    flat = {f"model.{k}": v for k, v in state["model"].items()}
    for index, slot in state["optimizer"]["state"].items():
        flat.update({f"optimizer.{index}.{k}": v for k, v in slot.items() if isinstance(v, torch.Tensor)})
    return flat


def assert_same_weights(a: Path, b: Path) -> None:
    ta, tb = tensors(a), tensors(b)
    assert ta.keys() == tb.keys()
    for key in ta:
        torch.testing.assert_close(ta[key], tb[key], atol=ATOL, rtol=RTOL, msg=key)


def losses(model_dir: Path) -> list[float]:
    """The logged train losses, full precision (model_dir/train/scalars.csv)."""
    with open(model_dir / "train" / "scalars.csv") as fh:
        return [float(row["value"]) for row in csv.DictReader(fh) if row["tag"] == "loss"]


def assert_same_losses(a: Path, b: Path) -> None:
    la, lb = losses(a), losses(b)
    assert len(la) == len(lb) == STEPS
    torch.testing.assert_close(torch.tensor(la), torch.tensor(lb), atol=ATOL, rtol=RTOL)
