"""A cs-run training state written in the vendor's format 0.5, for the real package to read back.

``python -m tests.checkpoint.vendor_roundtrip PATH`` (cs-run's venv) writes it; then, in the vendor's
venv, ``python tools/vendor_oracle/record.py check-resume PATH OUT.npz`` loads it with ``cstorch.load``,
resumes the vendor's AdamW from it and records the next steps (tests/data/vendor_oracle/csrun_resume.npz).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

import cs_run.optim as csoptim

DATA = Path(__file__).resolve().parents[1] / "data" / "vendor_oracle"
STEPS = 5  # cs-run trains this many steps before writing


def model_from_vendor_init() -> torch.nn.Sequential:
    """The model of the vendor's AdamW resume file, with its step-30 weights."""
    from cs_run.checkpoint import load

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    model.load_state_dict(load(DATA / "adamw_step30.mdl")["model"])
    return model


def data() -> tuple[torch.Tensor, torch.Tensor]:
    with np.load(DATA / "adamw_resume.npz") as f:
        return torch.from_numpy(f["x"]), torch.from_numpy(f["y"])


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    opt.step()


def training_state() -> tuple[dict, torch.nn.Module, torch.optim.Optimizer]:
    """cs-run's AdamW trained STEPS steps (batches 0..4) from the vendor's step-30 weights."""
    model = model_from_vendor_init()
    opt = csoptim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    x, y = data()
    for i in range(STEPS):
        step(model, opt, x[i], y[i])
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "global_step": STEPS,
             "note": "written by cs-run", "extra": {"none": None, "pair": (1, 2.5)}}
    return state, model, opt


def main(argv: list[str]) -> int:
    from cs_run.checkpoint import vendor_format

    state, _, _ = training_state()
    vendor_format.save(state, argv[0])
    print(f"wrote {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
