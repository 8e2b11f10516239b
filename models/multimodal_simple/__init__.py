"""multimodal_simple: the Model Zoo's multimodal_simple (``model.name: multimodal_simple``): image encoders
(the ViT trunk, each with a projection) and a global projection whose features a Llama text model reads at
the positions its MultimodalSimpleHDF5MapDataProcessor data names."""

from cs_run.registry import register_model

register_model("multimodal_simple", "cs_run.models.multimodal_simple.model:build_model",
               data_processors=("MultimodalSimpleHDF5MapDataProcessor",),
               config_class="cs_run.models.multimodal_simple.config:MultimodalSimpleConfig",
               builder="cs_run.models.multimodal_simple.model:build", input_keys=("text_model",))
