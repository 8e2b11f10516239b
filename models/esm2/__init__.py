"""esm2: the Model Zoo's ESM-2 protein language model (``model.name: esm2``): BERT's MLM pretraining with rotary
positions, token dropout and pre-norm layers; its Hugging Face adapter (EsmForMaskedLM)."""

from cs_run.registry import register_model

register_model("esm2", "cs_run.models.esm2.model:build_model",
               data_processors=("BertHDF5DataProcessor", "BertCSVDataProcessor", "BertCSVDynamicMaskDataProcessor"),
               hf_converter="cs_run.models.esm2.hf", hf_model_types=("esm",), input_keys=("disable_nsp",),
               config_class="cs_run.models.esm2.model:Esm2Config", builder="cs_run.models.esm2.model:build")
