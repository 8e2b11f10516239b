"""jais <-> its Hugging Face folder (remote code, ``model_type`` jais): btlm's mapping (the Model Zoo's
jais_hf_cs.py is btlm_hf_cs.py under another name; see :mod:`cs_run.models.btlm.hf`) with jais' names."""

from __future__ import annotations

from cs_run.models.btlm.hf import adapter

__all__ = ["ADAPTER", "from_hf", "to_hf"]

ADAPTER = adapter("jais")
from_hf, to_hf = ADAPTER.from_hf, ADAPTER.to_hf
