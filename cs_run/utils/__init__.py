"""``cstorch.utils``: data streaming (``utils.data``) and summaries (``utils.tensorboard``)."""

from typing import Any, Optional

from cs_run.distributed import ClusterConfig
from cs_run.utils import data as data
from cs_run.utils import tensorboard as tensorboard

__all__ = ["CSConfig", "data", "tensorboard"]


class CSConfig(ClusterConfig):
    """The 2.0 Model Zoo's ``cstorch.utils.CSConfig``: the cluster fields (None: the default) plus the
    appliance-only ``mgmt_namespace``, ``debug_args`` and ``precision_opt_level``, kept and unused here."""

    def __init__(self, mgmt_namespace: Optional[str] = None, debug_args: Any = None,
                 precision_opt_level: Optional[int] = None, **fields: Any) -> None:
        super().__init__(**{k: v for k, v in fields.items() if v is not None})
        self.mgmt_namespace, self.debug_args, self.precision_opt_level = mgmt_namespace, debug_args, precision_opt_level
