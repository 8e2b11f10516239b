"""cs-run's models, installed as ``cs_run.models``: shared layers in ``common/``, one folder per model
family with its registration, defaults and Hugging Face state-dict adapter.

Importing this package registers every family with :mod:`cs_run.registry` (each family's
``__init__`` names its functions as strings, so nothing heavy is imported until a model is built).
The registry imports it the first time a model name is looked up. Order matters once: a Model Zoo
file without ``model.name`` is given the first registered model whose data processor it names (gpt2).
"""

import importlib

FAMILIES = ("gpt2", "gpt3", "llama", "mistral", "mixtral", "gemma2", "starcoder", "santacoder", "jais", "btlm", "bloom", "mpt",
            "gptj", "gpt_neox", "falcon", "fc_mnist", "vision_transformer", "bert",
            "bert_classifier", "bert_token_classifier", "bert_summarization", "esm2", "dpo", "t5", "transformer",
            "dit", "dino", "llava", "dpr", "multimodal_simple")
"""Imported in this order (gpt2 first: see above)."""

for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")
