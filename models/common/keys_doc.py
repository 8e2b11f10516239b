"""docs/models.md, generated from the registered families' config classes (``python -m
cs_run.models.common.keys_doc > docs/models.md``); ``tests/models/test_model_specs.py`` checks it is current."""

from __future__ import annotations

import sys

from cs_run.models.common.config import config_table
from cs_run.registry import get_model_spec, registered_models, resolve_object

__all__ = ["models_markdown"]

_HEAD = """# Model families and their `model:` keys

Generated from each registered family's config class (`ModelSpec.config_class`) by
`python -m cs_run.models.common.keys_doc > docs/models.md`; do not edit by hand. `since` is the first
Model Zoo release whose gpt2/gptj code, layers or decoder params files name the key (1.6.0: that
release or earlier, the oldest mirrored). A key absent from a family's table is an unknown key there.
"""


def models_markdown() -> str:
    """One section per distinct key table: the families that share it, their config classes, then the table."""
    groups: dict[str, tuple[list[str], dict[str, type]]] = {}
    for name in registered_models():
        spec = get_model_spec(name)
        if spec.config_class:
            cls = resolve_object(spec.config_class)
            families, classes = groups.setdefault(config_table(cls), ([], {}))
            families.append(name)
            classes[spec.config_class.replace(":", ".")] = cls
    parts = [_HEAD]
    for table, (families, classes) in groups.items():
        docs = " ".join(f"`{path}`: {' '.join((cls.__doc__ or '').split())}" for path, cls in classes.items())
        parts.append(f"\n## {', '.join(families)}\n\n{docs}\n\n{table}")
    return "".join(parts)


if __name__ == "__main__":
    sys.stdout.write(models_markdown())
