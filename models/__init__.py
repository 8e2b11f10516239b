"""cs-run's models, installed as ``cs_run.models``: shared layers in ``common/``, one folder per model
family with its registration, defaults and Hugging Face state-dict adapter.

Importing this package registers every family with :mod:`cs_run.registry` (each family's
``__init__`` names its functions as strings, so nothing heavy is imported until a model is built).
The registry imports it the first time a model name is looked up. Order matters once: a Model Zoo
file without ``model.name`` is given the first registered model whose data processor it names (gpt2).
"""

from cs_run.models import bloom, btlm, fc_mnist, gemma2, gpt2, gpt3, jais, llama, mistral, mixtral, santacoder, starcoder  # noqa: F401  (gpt2 first: see above)  # noqa: F401
