"""``cs-run data preprocess --config``: the Model Zoo's data preprocessing configs, run by cs-run.

The vendor's setup / processing / dataset config in, the vendor's HDF5 files and data_params.json out
(see run.py for the stages and _output.py for the layout).
"""

from .run import PreprocessSummary as PreprocessSummary
from .run import preprocess_config as preprocess_config

__all__ = ["PreprocessSummary", "preprocess_config"]
