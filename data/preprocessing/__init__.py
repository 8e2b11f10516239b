"""``cs-run data preprocess``'s implementation: ``text_to_hdf5`` (text files -> GPT HDF5 shards with a
trained or given tokenizer) and ``_output_set`` (the output folder switched in as one set)."""
