"""A multimodal model's sub-model sections (``image_model``, ``text_model``, a projector: ``name`` plus that
family's keys), read one way by llava and multimodal_simple: the ``name`` one the model builds, the other keys
checked against the family's config class (names and types), and the text model's older spelling."""

from __future__ import annotations

from cs_run.registry import check_config_keys

__all__ = ["section_keys", "current_spelling"]


def section_keys(value: object, section: str, names: tuple, config_class: type, family: str) -> dict:
    """A sub-model's keys without its ``name``, checked against ``config_class`` (names and types); ``family``
    (the model reading it) and ``section`` (its key path under ``model``) name it in an error."""
    if not isinstance(value, dict):
        raise ValueError(f"{section}: expected a mapping of the {names[0]} keys, got {value!r}")
    keys = dict(value)
    got = keys.pop("name", None)
    if got not in names:
        raise ValueError(f"{section}.name: {got!r}; {family} builds {' or '.join(names)} here (the vendor's 2.10 "
                         f"{section})")
    check_config_keys(config_class, keys, f"model.{section}", lambda key: "")
    return keys


def current_spelling(text_model: object) -> object:
    """``embd_pdrop``, the vendor's field name of ``embedding_dropout_rate`` (its alias), as the latter."""
    if not isinstance(text_model, dict) or "embd_pdrop" not in text_model:
        return text_model
    keys = dict(text_model)
    value = keys.pop("embd_pdrop")
    if keys.setdefault("embedding_dropout_rate", value) != value:
        raise ValueError(f"text_model.embd_pdrop: {value} and embedding_dropout_rate {keys['embedding_dropout_rate']}"
                         " name one key twice; keep one")
    return keys
