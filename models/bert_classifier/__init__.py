"""bert/classifier: the Model Zoo's BERT sequence classifier (GLUE SST-2 and MNLI fine-tuning), model.name
``bert/classifier``, on bert's encoder."""

from cs_run.registry import register_model

register_model("bert/classifier", "cs_run.models.bert_classifier.model:build_model",
               data_processors=("SST2DataProcessor", "MNLIDataProcessor"),
               config_class="cs_run.models.bert_classifier.model:BertClassifierConfig",
               builder="cs_run.models.bert_classifier.model:build", hf_converter="cs_run.models.bert_classifier.hf")
