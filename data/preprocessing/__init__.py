"""``cs-run data preprocess``: raw inputs to HDF5 shards (``vendor_config``: the Model Zoo's config files)."""
