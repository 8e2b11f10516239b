"""dpr: the Model Zoo's Dense Passage Retriever (``model.name: dpr``), a question and a context encoder on bert's
encoder, trained contrastively over in-batch and hard negatives; it reads DPRHDF5DataProcessor's shards."""

from cs_run.registry import register_model

register_model("dpr", "cs_run.models.dpr.model:build_model", data_processors=("DPRHDF5DataProcessor",),
               hf_converter="cs_run.models.dpr.hf",
               config_class="cs_run.models.dpr.model:DPRConfig", builder="cs_run.models.dpr.model:build")
