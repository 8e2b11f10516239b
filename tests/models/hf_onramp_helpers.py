"""A tiny Hugging Face Llama folder as a user has one: random weights from a LlamaConfig and a small BPE
tokenizer wrapped in PreTrainedTokenizerFast, both saved with save_pretrained (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

EOS = "<|endoftext|>"  # the document separator cs-run data preprocess looks for


def corpus_lines(n: int = 160) -> list[str]:
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "far", "away"]
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(6 + i % 5)) + f" {i}" for i in range(n)]


def tiny_llama_folder(folder: Path, vocab_size: int = 128, max_positions: int = 32, tokenizer: bool = True) -> Path:
    """``folder`` holding a 2-layer Llama (grouped-query attention, untied head) and, with ``tokenizer``,
    its tokenizer files; the tokenizer's vocabulary is the model's."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    if tokenizer:
        tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tokenizers.decoders.ByteLevel()
        trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", EOS])
        tok.train_from_iterator(corpus_lines(), trainer)
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token=EOS,
                                                    unk_token="<unk>")
        vocab_size = max(vocab_size, tok.get_vocab_size())
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # HF sets norms to one: perturb every tensor
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(folder)
    if tokenizer:
        fast.save_pretrained(folder)
    return folder
