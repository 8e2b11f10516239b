"""DataLoader / DataExecutor / compute_num_steps / SyntheticDataset."""

from __future__ import annotations

import pytest
import torch

import cs_run as cstorch
from cs_run.utils.data import DataExecutor, DataLoader, SyntheticDataset, compute_num_steps, current_executor


def loader_fn(n: int = 10, batch_size: int = 2):
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(n).float()), batch_size=batch_size)


@pytest.mark.parametrize("kw,expected", [
    (dict(num_steps=7), 7),
    (dict(num_steps=7, max_steps=5), 5),
    (dict(num_epochs=2), 10),
    (dict(num_epochs=2, steps_per_epoch=3), 6),
    (dict(num_steps=7, steps_per_epoch=4), 7),
    (dict(num_epochs=3, max_steps=12), 12),
    (dict(max_steps=9, initial_step=4), 5),
    (dict(num_epochs=1, grad_accum_steps=2), 2),
])
def test_compute_num_steps(kw, expected):
    assert compute_num_steps(loader_fn(), **kw) == expected


@pytest.mark.parametrize("kw,match", [
    (dict(num_steps=2, num_epochs=1), "mutually exclusive"),
    (dict(num_steps=0), "Invalid num_steps"),
    (dict(), "set one of num_steps, num_epochs or max_steps"),
    (dict(steps_per_epoch=4), "only sets the length of an epoch"),
    (dict(max_steps=3, initial_step=3), "already reaches max_steps=3"),
])
def test_compute_num_steps_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        compute_num_steps(loader_fn(), **kw)


def test_dataloader_calls_input_fn_with_kwargs_and_old_form_cycles_epochs():
    calls = []

    def input_fn(n, batch_size):
        calls.append((n, batch_size))
        return loader_fn(n, batch_size)

    dl = DataLoader(input_fn, 4, batch_size=2, num_steps=5)  # 2 batches per epoch, 5 steps
    values = [b[0].tolist() for b in dl]
    assert values == [[0, 1], [2, 3], [0, 1], [2, 3], [0, 1]] and len(dl) == 5 and calls == [(4, 2)]
    assert len(DataLoader(input_fn, 4, batch_size=2)) == 2
    with pytest.raises(TypeError, match="callable input_fn"):
        DataLoader(loader_fn())


def test_executor_counters_profiler_and_current_executor():
    ex = DataExecutor(DataLoader(loader_fn), num_steps=7, checkpoint_steps=3)
    seen = []
    assert current_executor() is None
    for _batch in ex:
        assert current_executor() is ex
        seen.append((ex.iteration, ex.user_iteration, ex.on_final_iteration, ex.on_checkpoint_step))
    assert current_executor() is None
    assert [s[0] for s in seen] == list(range(7)) and [s[1] for s in seen] == list(range(1, 8))
    assert [s[2] for s in seen] == [False] * 6 + [True]
    assert [s[1] for s in seen if s[3]] == [3, 6, 7]
    assert ex.profiler.total_samples == 14 and ex.profiler.total_time > 0
    assert ex.profiler.global_rate() == pytest.approx(14 / ex.profiler.total_time)
    assert ex.profiler.rate() > 0 and len(ex) == 7


def test_executor_defaults_from_loader_and_backend():
    cstorch.backend("CPU", checkpoint_steps=2)
    assert DataExecutor(DataLoader(loader_fn, num_steps=4)).num_steps == 4
    assert DataExecutor(DataLoader(loader_fn)).num_steps == 5
    assert DataExecutor(DataLoader(loader_fn)).checkpoint_steps == 2
    with pytest.raises(ValueError, match="Invalid num_steps"):
        DataExecutor(DataLoader(loader_fn), num_steps=0)


def test_synthetic_dataset():
    ds = SyntheticDataset({"x": torch.ones(3), "i": lambda i: torch.tensor(i)}, num_samples=4)
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert batch["x"].shape == (4, 3) and batch["i"].tolist() == [0, 1, 2, 3] and len(ds) == 4
    with pytest.raises(TypeError):
        SyntheticDataset({"x": 3})
    with pytest.raises(IndexError):
        ds[4]
