"""cs-run's data home, installed as ``cs_run.data``: data processors registered by their Model Zoo class names
(``processors/``)."""
