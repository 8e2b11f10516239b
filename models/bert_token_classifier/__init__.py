"""bert/token_classifier: the Model Zoo's BERT token classifier (NER, e.g. BC5CDR-chem), model.name
``bert/token_classifier``, on bert's encoder."""

from cs_run.registry import register_model

register_model("bert/token_classifier", "cs_run.models.bert_token_classifier.model:build_model",
               data_processors=("BertTokenClassifierDataProcessor",),
               input_keys=("label_vocab_file", "include_padding_in_loss"),
               config_class="cs_run.models.bert_token_classifier.model:BertTokenClassifierConfig",
               keys_from_input=(("label_vocab_file", "label_vocab_file"),),  # R_1.6-2.1 token_classifier/utils.py
               builder="cs_run.models.bert_token_classifier.model:build",
               hf_converter="cs_run.models.bert_token_classifier.hf")
