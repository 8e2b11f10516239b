"""The seed-000 custom loop example runs on CPU and CSX with identical losses and weights."""

from __future__ import annotations

import torch

from cs_run.backend import _reset_for_tests
from cs_run.examples.fc_mnist import custom_loop


def run(backend, model_dir):
    with _reset_for_tests():
        return custom_loop.main(["--backend", backend, "--steps", "60", "--checkpoint_steps", "25",
                                 "--model_dir", str(model_dir)])


def test_custom_loop_cpu_equals_csx_and_checkpoints_on_schedule(tmp_path):
    cpu = run("CPU", tmp_path / "cpu")
    csx = run("CSX", tmp_path / "csx")
    assert len(cpu["losses"]) == 60 and cpu["losses"] == csx["losses"]  # same ops, same order: exact
    assert cpu["losses"][-1] < cpu["losses"][0] / 3
    for key, value in cpu["model"].state_dict().items():
        torch.testing.assert_close(csx["model"].state_dict()[key], value, rtol=0, atol=0)
    # checkpoint_closure runs on checkpoint steps and the final step only
    names = sorted(p.name for p in (tmp_path / "csx").glob("checkpoint_*"))
    assert names == ["checkpoint_25.mdl", "checkpoint_50.mdl", "checkpoint_60.mdl"]
