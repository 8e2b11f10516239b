"""Layers shared by the decoder families, each in a module named for what it holds: activations,
norms, initializers, position embeddings (embeddings, rotary, alibi), masks, attention, ffn, moe,
mup, the decoder stack (decoder) and the configurable language model (lm) with its family
registration helper (family)."""
