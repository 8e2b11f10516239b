"""dpo: the Model Zoo's Direct Preference Optimization model (model.name ``dpo``): a decoder family's policy
trained against a frozen reference copy on DpoHDF5DataProcessor's preference pairs."""

from cs_run.registry import register_model

register_model("dpo", "cs_run.models.dpo.model:build_model", data_processors=("DpoHDF5DataProcessor",),
               defaults_fn="cs_run.models.dpo.model:model_defaults")
