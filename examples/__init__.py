"""Example models with their params files; importable as ``cs_run.examples``."""
