"""gpt3: Cerebras-GPT and the Model Zoo's GPT-3 configs (learned positions, muP keys).

The Model Zoo's gpt3 is its GPT-2 decoder under this name with the same defaults; a params file
sets the family's features through the shared keys. ``checkpoint convert --to hf`` writes a GPT-2-shaped
gpt3 (learned positions, layernorm, no muP) as HF's GPT2LMHeadModel with gpt2's converter, which refuses by key
what GPT-2 cannot express; such a folder reads back (``--from hf``) as gpt2, the same model."""

from cs_run.models.common.family import register_decoder_family

register_decoder_family("gpt3", hf_converter="cs_run.models.gpt2.hf")
