"""llava: the Model Zoo's LLaVA (``model.name: llava``): a CLIP vision tower, a projector and a Llama text
model, its LlavaHDF5MapDataProcessor data and its Hugging Face adapter (LlavaForConditionalGeneration)."""

from cs_run.registry import register_model

register_model("llava", "cs_run.models.llava.model:build_model", data_processors=("LlavaHDF5MapDataProcessor",),
               hf_converter="cs_run.models.llava.hf", config_class="cs_run.models.llava.config:LlavaConfig",
               builder="cs_run.models.llava.model:build", input_keys=("image_model", "text_model"))
