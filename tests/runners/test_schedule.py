"""The run schedule, one rule for both front doors: ``compute_num_steps`` (cstorch) and the runner.

The expected answers are the vendor's: cerebras.pytorch 2.10 ``utils/data/utils.py:compute_num_steps``
(which Model Zoo 2.x's training loop calls) and Model Zoo 1.9.1's
``PyTorchBaseRunner._configure_run_steps``; both compute min(num_epochs x steps_per_epoch, num_steps,
max_steps - initial_step), with steps_per_epoch counted in batches, at most len(loader), divided by
grad_accum_steps, and raise for the combinations marked ``ERR`` below. (Each row was checked against
the vendor's function itself: same steps, an error for every ERR row.)
"""

from __future__ import annotations

import pytest
import torch

from cs_run.errors import ParamsError
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner
from cs_run.runners._checkpoint_files import list_checkpoints
from cs_run.schedule import UNBOUNDED_EPOCH, is_checkpoint_step, is_log_step, step_budget
from cs_run.utils.data import DataExecutor, DataLoader, compute_num_steps

ERR = "error"

# The table (the first four rows, where the two APIs disagreed) and more of the same class.
# (options, initial step, expected steps or (ERR, message)); the loader has 10 batches.
TABLE = [
    (dict(num_steps=10, steps_per_epoch=5), 0, 10),
    (dict(steps_per_epoch=5), 0, (ERR, "set one of")),
    (dict(num_epochs=3, steps_per_epoch=40), 0, (ERR, "exceeds the 10 batches")),
    (dict(max_steps=5), 8, (ERR, "already reaches")),
    (dict(max_steps=8), 8, (ERR, "already reaches")),
    (dict(max_steps=25), 20, 5),
    (dict(num_steps=7), 5, 7),
    (dict(num_steps=7, max_steps=9), 5, 4),
    (dict(num_epochs=3), 0, 30),
    (dict(num_epochs=3, steps_per_epoch=4), 0, 12),
    (dict(num_epochs=3, max_steps=25), 0, 25),
    (dict(num_epochs=2, grad_accum_steps=3), 0, 6),  # 10 batches // 3 = 3 steps an epoch
    (dict(num_epochs=2, steps_per_epoch=6, grad_accum_steps=4), 0, 2),
    (dict(num_steps=1, num_epochs=1), 0, (ERR, "mutually exclusive")),
    (dict(num_steps=1, grad_accum_steps=11), 0, (ERR, "greater than the 10 batches")),
    (dict(), 0, (ERR, "set one of")),
]


def loader(batches: int = 10, batch_size: int = 4) -> torch.utils.data.DataLoader:
    x = torch.arange(batches * batch_size * 6, dtype=torch.float32).reshape(-1, 6)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=batch_size)


@pytest.mark.parametrize("options, initial, expected", TABLE)
def test_compute_num_steps_answers_the_table(options, initial, expected):
    if isinstance(expected, tuple):
        with pytest.raises(ValueError, match=expected[1]):
            compute_num_steps(loader(), initial_step=initial, **options)
    else:
        assert compute_num_steps(loader(), initial_step=initial, **options) == expected


def test_starting_past_max_steps_is_also_the_vendors_runtime_error():
    with pytest.raises(RuntimeError, match="already reaches max_steps=5"):
        compute_num_steps(loader(), initial_step=8, max_steps=5)


def _runner(params_path, model_dir, options):
    """A runner whose runconfig holds exactly ``options`` (the toy params' max_steps removed)."""
    params_path.write_text(params_path.read_text().replace("  max_steps: 20\n", ""))
    keys = {"runconfig.model_dir": str(model_dir), "train_input.num_samples": 40}  # 10 batches of 4
    keys.update({f"runconfig.{k}": v for k, v in options.items() if k != "grad_accum_steps"})
    keys["optimizer.grad_accum_steps"] = options.get("grad_accum_steps", 1)
    params = load_params(params_path, keys)
    return PyTorchBaseRunner.create(params, device="CPU")


@pytest.mark.parametrize("options, initial, expected", TABLE)
def test_the_runner_answers_the_table_the_same_way(toy_project, tmp_path, options, initial, expected):
    model_dir = tmp_path / "md"
    if initial:  # a checkpoint at global step `initial` to resume from
        _runner(toy_project, model_dir, {"num_steps": initial}).run("train")
        assert list_checkpoints(model_dir)[-1][0] == initial
    if isinstance(expected, tuple):  # at load time (file and line) or when the loader is known
        with pytest.raises(ParamsError, match=expected[1]):
            _runner(toy_project, model_dir, options).run("train")
    else:
        runner = _runner(toy_project, model_dir, options)
        runner.run("train")
        assert runner.global_step - initial == expected


@pytest.mark.parametrize("name", ["num_steps", "max_steps", "num_epochs", "steps_per_epoch", "grad_accum_steps"])
@pytest.mark.parametrize("bad", [0, -3, 2.5, "4", True])
def test_every_step_option_rejects_non_positive_integers(name, bad):
    options = {"num_steps": 3, name: bad}
    with pytest.raises(ParamsError, match=f"Invalid {name}"):
        compute_num_steps(loader(), **options)
    with pytest.raises(ParamsError, match=f"params: Invalid (runconfig|optimizer).{name}"):
        step_budget(loader_batches=10, **options, where="params: ",
                    names={**{k: f"runconfig.{k}" for k in ("num_steps", "max_steps", "num_epochs", "steps_per_epoch")},
                           "grad_accum_steps": "optimizer.grad_accum_steps"})


def test_loader_without_length():
    # num_epochs cannot be counted; steps_per_epoch (batches) still sets the epoch length.
    with pytest.raises(ParamsError, match="needs a dataloader with a length"):
        step_budget(loader_batches=None, num_epochs=1)
    assert step_budget(loader_batches=None, num_steps=7, steps_per_epoch=6, grad_accum_steps=2).steps_per_epoch == 3
    assert step_budget(loader_batches=None, max_steps=7).steps_per_epoch == UNBOUNDED_EPOCH
    with pytest.raises(ParamsError, match="yields no batches"):
        step_budget(loader_batches=0, num_steps=1)


def test_log_and_checkpoint_steps_count_from_the_run_start_and_always_include_the_last():
    assert [s for s in range(1, 8) if is_log_step(s, 7, 3)] == [3, 6, 7]
    assert [s for s in range(1, 8) if is_log_step(s, 7, 0)] == [7]
    assert [s for s in range(1, 8) if is_checkpoint_step(s, 7, 2)] == [2, 4, 6, 7]
    assert [s for s in range(1, 8) if is_checkpoint_step(s, 7, None)] == [7]


def test_executor_and_runner_checkpoint_on_the_same_steps(toy_project, tmp_path):
    seen = []
    executor = DataExecutor(DataLoader(loader), num_steps=7, checkpoint_steps=3)
    for _ in executor:
        seen.append((executor.user_iteration, executor.on_checkpoint_step, executor.on_final_iteration))
    assert [s for s, ckpt, _ in seen if ckpt] == [3, 6, 7] and [s for s, _, fin in seen if fin] == [7]
    # The runner, resumed at global step 2: run steps 3 and 6 are global steps 5 and 8 (vendor: run-relative).
    model_dir = tmp_path / "md"
    _runner(toy_project, model_dir, {"num_steps": 2}).run("train")
    _runner(toy_project, model_dir, {"num_steps": 7, "checkpoint_steps": 3}).run("train")
    assert [step for step, _ in list_checkpoints(model_dir)] == [2, 5, 8, 9]


def test_an_empty_loader_is_an_error_not_a_silent_zero_step_run():
    empty = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(0, 2)), batch_size=2)
    with pytest.raises(ValueError, match="yields no batches"):
        list(DataExecutor(empty, num_steps=3))
    with pytest.raises(ValueError, match="yields no batches"):
        list(DataLoader(lambda: empty, num_steps=3))
