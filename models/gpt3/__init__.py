"""gpt3: Cerebras-GPT and the Model Zoo's GPT-3 configs (learned positions, muP keys).

The Model Zoo's gpt3 is its GPT-2 decoder under this name with the same defaults; a params file
sets the family's features through the shared keys."""

from cs_run.models.common.family import register_decoder_family

register_decoder_family("gpt3")
