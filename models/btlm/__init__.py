"""btlm: Cerebras' BTLM (ALiBi, SwiGLU, muP).

The Model Zoo's btlm is its GPT-2 decoder under this name with the same defaults; a params file
sets the family's features through the shared keys."""

from cs_run.models.common.family import register_decoder_family

register_decoder_family("btlm", hf_converter="cs_run.models.btlm.hf")
