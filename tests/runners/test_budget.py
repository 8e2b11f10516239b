"""Step budget: the Model Zoo rules for num_steps / num_epochs / max_steps / steps_per_epoch."""

import pytest

from cs_run.errors import ParamsError
from cs_run.runners._budget import compute_step_budget


@pytest.mark.parametrize("kwargs, steps, per_epoch", [
    (dict(global_step=0, loader_steps=10, max_steps=25), 25, 10),
    (dict(global_step=20, loader_steps=10, max_steps=25), 5, 10),  # resumed: max_steps is global
    (dict(global_step=30, loader_steps=10, max_steps=25), 0, 10),  # already past it
    (dict(global_step=5, loader_steps=10, num_steps=7), 7, 10),  # num_steps counts from now
    (dict(global_step=5, loader_steps=10, num_steps=7, max_steps=9), 4, 10),
    (dict(global_step=0, loader_steps=10, num_epochs=3), 30, 10),
    (dict(global_step=0, loader_steps=10, num_epochs=3, steps_per_epoch=4), 12, 4),
    (dict(global_step=0, loader_steps=10, num_epochs=3, steps_per_epoch=40), 30, 10),  # a pass caps an epoch
    (dict(global_step=0, loader_steps=10, num_epochs=3, max_steps=25), 25, 10),
    (dict(global_step=0, loader_steps=None, num_epochs=2, steps_per_epoch=6), 12, 6),
])
def test_budget(kwargs, steps, per_epoch):
    budget = compute_step_budget(**kwargs)
    assert (budget.steps, budget.steps_per_epoch) == (steps, per_epoch)


@pytest.mark.parametrize("kwargs, message", [
    (dict(global_step=0, loader_steps=10), "set one of runconfig.max_steps"),
    (dict(global_step=0, loader_steps=10, num_steps=1, num_epochs=1), "mutually exclusive"),
    (dict(global_step=0, loader_steps=None, num_epochs=1), "needs runconfig.steps_per_epoch"),
    (dict(global_step=0, loader_steps=0, max_steps=3), "yields no full step"),
])
def test_budget_errors(kwargs, message):
    with pytest.raises(ParamsError, match=message):
        compute_step_budget(**kwargs)
