"""The data home (``cs_run.data``): preprocessing of raw text into the Model Zoo's HDF5 layouts."""
