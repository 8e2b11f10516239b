"""cs-run's data home, installed as ``cs_run.data``: the Model Zoo's data processors by their class names
(``processors/``)."""
