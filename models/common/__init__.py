"""Layers shared by the decoder families, each in a module named for what it holds: activations,
norms, initializers, position embeddings (embeddings, rotary, alibi), masks, attention, ffn, moe,
mup, the decoder stack (decoder), the decoder's keys (config), the configurable language model (lm),
the GPT-J config and builder (parallel), the family registration helper (family) and the keys'
page, docs/models.md (keys_doc)."""
