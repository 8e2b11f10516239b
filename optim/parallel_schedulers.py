"""Schedulers stepped side by side (``cs_run.optim.parallel_schedulers``): the Model Zoo trainer's ``schedulers`` list.

The 2.10 trainer builds every entry of ``trainer.init.schedulers`` as its own scheduler of the param groups
its ``param_group_tags`` name, steps them one after the other after each optimizer step and checkpoints
their states as a list (``trainer/callbacks/schedulers.py``). A run here holds one schedule object, so
:class:`ParallelSchedulers` is that list behind the one-schedule protocol (``step``, ``state_dict``).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations
from typing import Any

from .scheduler import Scheduler

__all__ = ["ParallelSchedulers"]


class ParallelSchedulers:
    """Several schedulers of one optimizer, each setting its own key (lr, weight_decay) of its own groups.

    The vendor's rules on building them (``SchedulersCallback.setup``) are checked here: two schedulers
    of one key must both name ``param_group_tags`` and share none, and no param group may be set by two
    schedulers of one key.

    Args:
        schedulers: the schedulers, stepped in this order.
        names: how messages name each scheduler (its key path, e.g. ``optimizer.schedulers[3]``).

    Raises:
        ValueError: the schedulers overlap as above, or belong to different optimizers.
    """

    def __init__(self, schedulers: list[Scheduler], names: list[str] | None = None) -> None:
        self.schedulers = list(schedulers)
        if not self.schedulers:
            raise ValueError("ParallelSchedulers needs at least one scheduler")
        self._names = list(names) if names else [f"schedulers[{i}]" for i in range(len(self.schedulers))]
        self.optimizer = self.schedulers[0].optimizer
        for name, scheduler in zip(self._names, self.schedulers):
            if scheduler.optimizer is not self.optimizer:
                raise ValueError(f"{name}: belongs to another optimizer than the first scheduler's")
        self._check_overlaps()

    def _label(self, index: int) -> str:
        return f"{self._names[index]} ({type(self.schedulers[index]).__name__})"

    def _check_overlaps(self) -> None:
        pairs = combinations(range(len(self.schedulers)), 2)
        for i, j in pairs:
            first, second = self.schedulers[i], self.schedulers[j]
            key = first.param_group_key
            if key != second.param_group_key:
                continue
            if first.param_group_tags is None or second.param_group_tags is None:
                raise ValueError(f"{self._label(i)} and {self._label(j)} both set {key!r} and at least one names no "
                                 "param_group_tags (it sets every group); give each the tags of its own groups")
            shared = first.param_group_tags & second.param_group_tags
            if shared:
                raise ValueError(f"{self._label(i)} and {self._label(j)} both set {key!r} of the groups tagged "
                                 f"{sorted(map(str, shared))}; a tag may be named by one scheduler of a key")
        for index, group in enumerate(self.optimizer.param_groups):
            setters: dict[str, list[int]] = {}
            for s, scheduler in enumerate(self.schedulers):
                if scheduler._applies_to(group):
                    setters.setdefault(scheduler.param_group_key, []).append(s)
            for key, which in setters.items():
                if len(which) > 1:
                    raise ValueError(f"{' and '.join(self._label(s) for s in which)} all set {key!r} of param "
                                     f"group {index} (tags {sorted(map(str, group.get('tags') or ()))}); a group's "
                                     "value may come from one scheduler of a key")

    def __iter__(self) -> Iterator[Scheduler]:
        return iter(self.schedulers)

    def __len__(self) -> int:
        return len(self.schedulers)

    def __getitem__(self, index: int) -> Scheduler:
        return self.schedulers[index]

    def step(self) -> None:
        """Step every scheduler once, in order (after the optimizer step, as the vendor's trainer)."""
        for scheduler in self.schedulers:
            scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """``{"schedulers": [each one's state]}``, the list the vendor's trainer checkpoints."""
        return {"schedulers": [scheduler.state_dict() for scheduler in self.schedulers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Each scheduler's state from the list; a single schedule's state (``last_epoch``, from a
        checkpoint of a run with one schedule) sets every one, as they all count the same steps."""
        if "schedulers" not in state_dict:
            for scheduler in self.schedulers:
                scheduler.load_state_dict(state_dict)
            return
        states = state_dict["schedulers"]
        if len(states) != len(self.schedulers):
            raise ValueError(f"the checkpoint holds {len(states)} scheduler states and this run has "
                             f"{len(self.schedulers)} schedulers")
        for scheduler, state in zip(self.schedulers, states):
            scheduler.load_state_dict(state)

    def get_last_lr(self) -> list[Any]:
        """Every group's current lr tensor (copies; read their values in a step closure on CSX)."""
        return [group["lr"].detach().clone() if hasattr(group["lr"], "detach") else group["lr"]
                for group in self.optimizer.param_groups]
