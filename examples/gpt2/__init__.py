"""gpt2: the Model Zoo's GPT-2 params file (its ``model:`` keys; GptHDF5DataProcessor shards, read by
``cs_run.data`` and written by ``cs-run data preprocess``), trainable offline."""
