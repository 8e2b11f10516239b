"""Data processors, one module per Model Zoo data processor family (named as the Model Zoo names them)."""
