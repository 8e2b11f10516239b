"""mpt: MosaicML's MPT (ALiBi, no biases, biasless LayerNorm, GELU FFN) -- a Model Zoo family of
Releases 2.1-2.3 (``models/nlp/mpt``).

The Model Zoo's mpt is its GPT-2 decoder under this name with GPT-2's defaults (``MPTConfig(GPT2Config):
pass``): its params files set the MPT features (``position_embedding_type: alibi``, ``norm_type:
biasless-layernorm``, ``use_*bias*: false``) through the shared keys, and so does ``convert --from hf``."""

from cs_run.models.common.family import register_decoder_family

register_decoder_family("mpt", hf_converter="cs_run.models.mpt.hf")
