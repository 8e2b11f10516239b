"""``cs-run data preprocess``'s implementation: ``text_to_hdf5`` (text files -> GPT HDF5 shards with a
trained or given tokenizer), ``vendor_config`` (the Model Zoo's preprocessing config files, ``--config``) and
``_output_set`` (the output folder switched in as one set)."""
