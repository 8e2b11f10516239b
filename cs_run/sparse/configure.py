"""``cstorch.sparse.configure``: a sparsity algorithm from a params file's ``sparsity`` section."""

from __future__ import annotations

from typing import Any, Optional

import torch

from cs_run.errors import ParamsError
from cs_run.sparse.gmp import GMP
from cs_run.sparse.group import Group
from cs_run.sparse.rigl import RigL
from cs_run.sparse.set import SET
from cs_run.sparse.static import Static
from cs_run.sparsity_params import check_sparsity

__all__ = ["configure", "default_sparse_param_filter", "map_sparsity_algorithm"]

_CLASSES = {"static": Static, "gmp": GMP, "set": SET, "rigl": RigL}


def default_sparse_param_filter(name: str, param: torch.Tensor) -> bool:
    """Weights of more than one dimension, except embeddings, norms, the LM head and position helpers."""
    lowered = name.lower()
    return param is not None and param.dim() > 1 and not any(
        word in lowered for word in ("embedding", "norm", "lm_head", "pe_helper"))


def map_sparsity_algorithm(algorithm: str) -> type:
    """The algorithm class of a name (``rigl`` -> :class:`RigL`), case-insensitive."""
    try:
        return _CLASSES[algorithm.lower()]
    except KeyError:
        raise ValueError(f"unknown sparsity algorithm {algorithm!r}; one of {', '.join(_CLASSES)}") from None


def configure(config: Any, key: str = "sparsity", locate=lambda key: "") -> Optional[Group]:
    """A :class:`Group` from a sparsity level, one config mapping or a list of them (the params file's
    ``sparsity`` section, checked by :func:`cs_run.sparsity_params.check_sparsity`); None when the
    config asks for no sparsity.

    Raises:
        ParamsError: a key or value the vendor's API does not take, naming it.
    """
    group = Group()
    for entry_key, entry in check_sparsity(config, key, locate):
        entry = dict(entry)
        algorithm = map_sparsity_algorithm(entry.pop("algorithm"))
        param_filter = entry.pop("param_filter", None)
        entry.pop("add_summaries", None)  # the runner's summaries (LogSparsity), not the algorithm's
        try:
            instance = algorithm(**entry)
        except (TypeError, ValueError) as e:
            raise ParamsError(f"params: {entry_key}: {e}{locate(entry_key)}") from None
        group.add(param_filter if param_filter is not None else default_sparse_param_filter, instance)
    return group if len(group) else None
