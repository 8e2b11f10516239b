"""jais: JAIS (ALiBi, SwiGLU, muP).

The Model Zoo's jais is its GPT-2 decoder under this name with the same defaults; a params file
sets the family's features through the shared keys."""

from cs_run.models.common.family import register_decoder_family

register_decoder_family("jais", hf_converter="cs_run.models.jais.hf")
