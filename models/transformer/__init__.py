"""transformer: the Model Zoo's "Attention is all you need" encoder-decoder (``model.name: transformer``), which
the vendor builds on its T5 code (models/nlp/transformer/model.py: TransformerModel is
T5ForConditionalGenerationModel with T5ModelConfig's keys); its files set fixed positions, post-norm, FFN
biases, the Transformer's initializers and scaled attention. It reads parallel text
(TransformerDynamicDataProcessor). Hugging Face has no such model: no converter."""

from cs_run.registry import register_model

register_model("transformer", "cs_run.models.t5.model:build_model", data_processors=("TransformerDynamicDataProcessor",),
               config_class="cs_run.models.t5.config:T5Config", builder="cs_run.models.t5.model:build",
               keys_from_input=(("src_max_position_embeddings", "src_max_sequence_length"),
                                ("tgt_max_position_embeddings", "tgt_max_sequence_length")))
