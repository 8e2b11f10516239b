"""gpt2: the Model Zoo's GPT-2 (params ``model:`` keys, GptHDF5DataProcessor shards), trainable offline."""
