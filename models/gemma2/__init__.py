"""gemma2: Gemma 2 (logit softcapping, sandwich norms, every-other-layer sliding windows).

The Model Zoo's gemma2 is its GPT-2 decoder under this name with the same defaults; a params file
sets the family's features through the shared keys."""

from cs_run.models.common.family import register_decoder_family

register_decoder_family("gemma2", hf_converter="cs_run.models.gemma2.hf")
