"""bert/extractive_summarization: the Model Zoo's BERTSUM extractive summarizer (a score per sentence at its
[CLS] token), model.name ``bert/extractive_summarization``, on bert's encoder. Hugging Face has no such class:
it has no converter."""

from cs_run.registry import register_model

register_model("bert/extractive_summarization", "cs_run.models.bert_summarization.model:build_model",
               data_processors=("BertSumCSVDataProcessor",), input_keys=("vocab_file",),
               config_class="cs_run.models.bert_summarization.model:BertSummarizationConfig",
               builder="cs_run.models.bert_summarization.model:build")
