"""bert: the Model Zoo's BERT pretraining (MLM + NSP), model.name ``bert`` (RoBERTa's files are bert with
``disable_nsp`` and ``mask_padding_in_positional_embed``)."""

from cs_run.registry import register_model

BERT_DATA_PROCESSORS = ("BertCSVDynamicMaskDataProcessor", "BertHDF5DataProcessor", "BertCSVDataProcessor")

register_model("bert", "cs_run.models.bert.model:build_model", data_processors=BERT_DATA_PROCESSORS,
               hf_converter="cs_run.models.bert.hf", hf_model_types=("roberta",), input_keys=("disable_nsp",),
               config_class="cs_run.models.bert.model:BertConfig", builder="cs_run.models.bert.model:build")
