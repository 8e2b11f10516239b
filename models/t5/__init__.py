"""t5: the Model Zoo's T5 encoder-decoder (``model.name: t5``), its span-corruption text data and its Hugging
Face adapter (T5ForConditionalGeneration)."""

from cs_run.registry import register_model

register_model("t5", "cs_run.models.t5.model:build_model", data_processors=("T5DynamicDataProcessor",),
               hf_converter="cs_run.models.t5.hf", hf_model_types=("t5",),
               config_class="cs_run.models.t5.config:T5Config", builder="cs_run.models.t5.model:build",
               keys_from_input=(("src_max_position_embeddings", "src_max_sequence_length"),
                                ("tgt_max_position_embeddings", "tgt_max_sequence_length")))
