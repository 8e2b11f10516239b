"""``cstorch.sparse.Group``: several algorithms, each for the parameters its filter picks."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from cs_run.sparse.base import SparsityAlgorithm

__all__ = ["Group"]

Filter = Callable[[str, torch.Tensor], bool]


def make_param_filter(param_filter: Union[str, list, tuple, Filter]) -> Filter:
    """Globs (``'*proj_[qkv]_dense_layer.weight'``, matched against the whole name) or a callable."""
    if isinstance(param_filter, str):
        param_filter = [param_filter]
    if isinstance(param_filter, (list, tuple)):
        globs = list(param_filter)
        if not all(isinstance(g, str) for g in globs):
            raise TypeError(f"a parameter filter is a glob or a list of globs, got {param_filter!r}")
        return lambda name, param: any(fnmatch.fnmatchcase(name, g) for g in globs)
    if callable(param_filter):
        return param_filter
    raise TypeError(f"a parameter filter is a glob, a list of globs or a callable, got {param_filter!r}")


class Group(SparsityAlgorithm):
    """``Group({"fc1.*": Static(sparsity=0.5), "fc2.*": SET(sparsity=0.7)})``: a parameter goes to the
    first algorithm whose filter matches its name; each algorithm then works as if applied alone."""

    @dataclass
    class Filter:
        filter: Filter
        algorithm: SparsityAlgorithm

    def __init__(self, groups: Optional[dict] = None) -> None:
        super().__init__(sparsity=None)
        self._groups: list[Group.Filter] = []
        for flt, algorithm in (groups or {}).items():
            self.add(flt, algorithm)

    def __getitem__(self, index: int) -> SparsityAlgorithm:
        return self._groups[index].algorithm

    def __len__(self) -> int:
        return len(self._groups)

    @property
    def num_sparse_params(self) -> int:
        return sum(g.algorithm.num_sparse_params for g in self._groups)

    def add(self, param_filter: Union[str, list, Filter], algorithm: SparsityAlgorithm) -> None:
        if isinstance(algorithm, Group) or not isinstance(algorithm, SparsityAlgorithm):
            raise TypeError(f"a group entry is a sparsity algorithm (not a Group: use extend), got {algorithm!r}")
        self._groups.append(Group.Filter(make_param_filter(param_filter), algorithm))

    def extend(self, group: "Group") -> None:
        if not isinstance(group, Group):
            raise TypeError(f"extend takes a Group, got {type(group).__name__}")
        self._groups.extend(group._groups)

    def sparsify_module(self, module: torch.nn.Module, select=None) -> int:
        if not self._groups:
            raise RuntimeError("the sparsity Group has no algorithms")

        def owner(name: str, param: torch.Tensor) -> Optional[SparsityAlgorithm]:
            return next((g.algorithm for g in self._groups if g.filter(name, param)), None)

        added = sum(g.algorithm.sparsify_module(
            module, lambda n, p, a=g.algorithm: owner(n, p) is a and (select is None or select(n, p)))
            for g in self._groups)
        self.sparse_params.clear()
        for g in self._groups:
            self.sparse_params.update(g.algorithm.sparse_params)
        return added

    def sparsify_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if not self.num_sparse_params:
            raise RuntimeError("optimizer.apply(sparsity) before model.apply(sparsity), or the filters matched no "
                               "parameter: sparsify the model first")
        for g in self._groups:
            if g.algorithm.num_sparse_params:
                g.algorithm.sparsify_optimizer(optimizer)

    def update(self, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
        for g in self._groups:
            g.algorithm.update(optimizer)

    def register_target_sparsity_hook(self, hook):
        return [g.algorithm.register_target_sparsity_hook(hook) for g in self._groups]

    def register_computed_sparsity_hook(self, hook):
        return [g.algorithm.register_computed_sparsity_hook(hook) for g in self._groups]

    def state_dict(self) -> list:
        return [g.algorithm.state_dict() for g in self._groups]

    def load_state_dict(self, state) -> None:
        states = [state] if isinstance(state, dict) else list(state)
        if len(states) != len(self._groups):
            raise ValueError(f"the checkpoint's sparsity state has {len(states)} entries, this Group "
                             f"{len(self._groups)} algorithms")
        for s, g in zip(states, self._groups):
            g.algorithm.load_state_dict(s)
