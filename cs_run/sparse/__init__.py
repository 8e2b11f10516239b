"""``cstorch.sparse``: sparse training with weight masks, as the vendor's sparse API defines it.

``sparsity = cstorch.sparse.configure(config)`` (or an algorithm: :class:`Static`, :class:`GMP`,
:class:`SET`, :class:`RigL`, or a :class:`Group` of them), then ``model.apply(sparsity)`` and
``optimizer.apply(sparsity)``. The masks are the model's ``<weight>_mask`` buffers; the algorithm's
step counter is ``sparsity.state_dict()``. docs/architecture.md#sparsity.
"""

from cs_run.sparse import init as init
from cs_run.sparse import utils as utils
from cs_run.sparse.base import SparseParameter as SparseParameter
from cs_run.sparse.base import SparsityAlgorithm as SparsityAlgorithm
from cs_run.sparse.configure import configure as configure
from cs_run.sparse.configure import default_sparse_param_filter as default_sparse_param_filter
from cs_run.sparse.configure import map_sparsity_algorithm as map_sparsity_algorithm
from cs_run.sparse.dynamic import DynamicSparsityAlgorithm as DynamicSparsityAlgorithm
from cs_run.sparse.gmp import GMP as GMP
from cs_run.sparse.group import Group as Group
from cs_run.sparse.rigl import RigL as RigL
from cs_run.sparse.set import SET as SET
from cs_run.sparse.static import Static as Static

__all__ = ["GMP", "SET", "DynamicSparsityAlgorithm", "Group", "RigL", "SparseParameter", "SparsityAlgorithm",
           "Static", "configure", "default_sparse_param_filter", "init", "map_sparsity_algorithm", "utils"]
