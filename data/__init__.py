"""cs-run's data home (``cs_run.data``): the Model Zoo's data processors, by their class names, in ``processors/``."""
