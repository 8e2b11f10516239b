"""The vendor's ``freeze`` model key (its freeze_modules): parts of a model that get no gradient, named by
regular expressions, shared by the families that have the key (dino, llava)."""

from __future__ import annotations

import re

from torch import nn

__all__ = ["freeze_modules"]


def freeze_modules(model: nn.Module, patterns: list, examples: str = "") -> None:
    """No gradient for the leaf modules whose names (relative to ``model``) match a pattern (regex search), nor
    for the parameters whose names match. The vendor also puts the frozen modules in eval mode, which changes
    only dropout; here they follow the run's mode. ``examples`` (pattern examples) ends the no-match error.

    Raises:
        ValueError: a pattern that is not a regular expression or matches no module (the vendor's error).
    """
    leaves = [(n, m) for n, m in model.named_modules() if not next(m.children(), False)]
    for i, pattern in enumerate(patterns):
        try:
            compiled = re.compile(pattern)
        except (re.error, TypeError) as e:
            raise ValueError(f"freeze[{i}]: {pattern!r} is not a regular expression ({e})") from None
        matched = [m for n, m in leaves if compiled.search(n)]
        if not matched:
            raise ValueError(f"freeze[{i}]: {pattern!r} matches no module of the model"
                             + (f" (e.g. {examples})" if examples else ""))
        for m in matched:
            m.requires_grad_(False)
        for n, p in model.named_parameters():
            if compiled.search(n):
                p.requires_grad_(False)
