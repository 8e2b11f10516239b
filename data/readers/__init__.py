"""The shard layouts the data processors read: ``hdf5_samples`` (GptHDF5DataProcessor's
``[n, 3, msl]`` samples) and ``hdf5_map`` (the map-style sample and corpus layouts, mixtures, subsets)."""
