"""Docstring fragments shared by the optimizers (one wording, many classes)."""

__all__ = ["COMPLIANT", "MAXIMIZE", "PARAMS", "WEIGHT_DECAY", "fill"]

PARAMS = "params: iterable of parameters or dicts defining parameter groups."
WEIGHT_DECAY = "weight_decay: L2 penalty coefficient added to the gradient (default: 0)."
MAXIMIZE = "maximize: maximize the objective instead of minimizing it (default: False)."
COMPLIANT = (
    "All state is created in ``preinitialize()``; ``step()`` uses torch ops only and reads the learning "
    "rate as the 0-d tensor ``param_group['lr']``, so a traced step is captured once for every lr."
)


def fill(doc: str | None) -> str | None:
    """Substitute the shared fragments ``{params}``, ``{weight_decay}``, ``{maximize}``, ``{compliant}``."""
    if doc is None:  # python -OO strips docstrings
        return None
    for key, text in (("params", PARAMS), ("weight_decay", WEIGHT_DECAY), ("maximize", MAXIMIZE),
                      ("compliant", COMPLIANT)):
        doc = doc.replace("{" + key + "}", text)
    return doc
