"""cs-run's data home, installed as ``cs_run.data``: the Model Zoo's data processors and what they read.

* ``processors/``: one module per processor family, each data function registered by the Model Zoo
  class names it serves (``@register_data_processor("GptHDF5DataProcessor", ...)``); a model names the
  processors its inputs read (:class:`cs_run.registry.ModelSpec`) and the runner looks the function up
  by the input's ``data_processor``.
* ``readers/``: the shard layouts (GPT HDF5 samples, the map-style sample and corpus layouts).
* ``preprocessing/``: what ``cs-run data preprocess`` writes.
* ``transforms.py``: the Model Zoo's batch ``data_transforms``.

Nothing here imports a model, a runner or a front end (docs/architecture.md#layers).
"""

from cs_run.registry import register_data_processor, registered_data_processors

__all__ = ["register_data_processor", "registered_data_processors"]
