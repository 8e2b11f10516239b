"""``cstorch.utils``: data streaming (``utils.data``) and summaries (``utils.tensorboard``)."""

from cs_run.utils import data as data
from cs_run.utils import tensorboard as tensorboard

__all__ = ["data", "tensorboard"]
