"""``cstorch.utils``: data streaming (``utils.data``)."""

from cs_run.utils import data as data

__all__ = ["data"]
