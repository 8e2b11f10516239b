"""The config's tokenizer, loaded from local files only, with the ids the vendor's tool derives from it.

``huggingface_tokenizer`` is a folder holding tokenizer.json (and tokenizer_config.json /
special_tokens_map.json, which name eos and pad) or the tokenizer.json itself, or a folder EsmTokenizer saved
(vocab.txt, tokenizer_class EsmTokenizer: ESM-2's, which has no tokenizer.json), rebuilt as the same splitting
(:func:`esm_backend`); ``custom_tokenizer: gpt2tokenizer`` is the gpt2 encoder.json + vocab.bpe pair. Nothing
is downloaded. The ids follow the vendor's rules: eos from the tokenizer's eos token, pad from its pad token
or else eos; the config's ``eos_id`` sets both, its ``pad_id`` sets pad; for gpt2 both are <|endoftext|>.
vocab_size counts added tokens (``len(tokenizer)``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from cs_run.errors import ParamsError

__all__ = ["LoadedTokenizer", "load_tokenizer"]

GPT2_EOS = "<|endoftext|>"
_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "chat_template")


@dataclass
class LoadedTokenizer:
    """A `tokenizers.Tokenizer` and its eos / pad ids and vocabulary size."""

    backend: Any
    eos_id: Optional[int]
    pad_id: Optional[int]
    vocab_size: int
    sep_token: Optional[str] = None  # the tokenizer's own sep token (finetuning's default separator)
    chat_template: Optional[str] = None  # tokenizer_config.json's chat_template
    special_tokens: dict = field(default_factory=dict)  # bos_token, eos_token, ... as a chat template sees them

    @property
    def eos_token(self) -> Optional[str]:
        """The eos id's token text (finetuning appends it to the completion as text)."""
        return None if self.eos_id is None else self.backend.id_to_token(self.eos_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids (special tokens added as the tokenizer's post-processor says, unless not asked) and
        character offsets."""
        enc = self.backend.encode(text, add_special_tokens=add_special_tokens)
        return list(enc.ids), list(enc.offsets)


def _token_name(value: Any) -> Optional[str]:
    if isinstance(value, dict):  # {"content": "<|endoftext|>", ...} (an AddedToken written out)
        return value.get("content")
    return value if isinstance(value, str) else None


def _special_names(folder: str) -> dict[str, Optional[str]]:
    """eos / pad token names from tokenizer_config.json, then special_tokens_map.json (the first that names it)."""
    names: dict[str, Optional[str]] = dict.fromkeys(_SPECIAL, None)
    for fname in ("tokenizer_config.json", "special_tokens_map.json"):
        path = os.path.join(folder, fname)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise ParamsError(f"data preprocess --config: {path} cannot be read as JSON ({e}); fix or remove it") \
                from None
        for key in names:
            if names[key] is None:
                names[key] = data.get(key) if key == "chat_template" else _token_name(data.get(key))
    return names


def esm_backend(vocab_file: str) -> Any:
    """EsmTokenizer (transformers) as a `tokenizers.Tokenizer`: the text is cut at every vocabulary token
    (longest first, EsmTokenizer's trie), what lies between is split on whitespace and each piece is one token
    (<unk> where it is not in the vocabulary); ``<cls> ... <eos>`` around it."""
    import re  # noqa: PLC0415

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors

    with open(vocab_file, encoding="utf-8") as f:
        tokens = [line.strip() for line in f.read().splitlines()]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    pattern = "|".join(re.escape(t) for t in sorted((t for t in vocab if t), key=len, reverse=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), "isolated"),
                                                     pre_tokenizers.WhitespaceSplit()])
    if "<cls>" in vocab and "<eos>" in vocab:
        backend.post_processor = processors.TemplateProcessing(
            single="<cls> $A <eos>", pair="<cls> $A <eos> $B <eos>",
            special_tokens=[("<cls>", vocab["<cls>"]), ("<eos>", vocab["<eos>"])])
    return backend


def is_esm_folder(folder: str) -> bool:
    """A folder EsmTokenizer saved: vocab.txt and tokenizer_config.json naming EsmTokenizer."""
    config = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(os.path.join(folder, "vocab.txt")) or not os.path.isfile(config):
        return False
    try:
        with open(config, encoding="utf-8") as f:
            return json.load(f).get("tokenizer_class") == "EsmTokenizer"
    except (OSError, ValueError):
        return False


def load_tokenizer(kind: str, path: str, gpt2_files: tuple[str, str], eos_override: Optional[int],
                   pad_override: Optional[int], where: str) -> LoadedTokenizer:
    """Load the config's tokenizer. Raises ParamsError naming ``where`` (the config key's file:line)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    try:
        if kind == "gpt2":
            encoder, vocab = gpt2_files
            backend = Tokenizer(models.BPE.from_file(encoder, vocab))
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            backend.decoder = decoders.ByteLevel()
            backend.add_special_tokens([GPT2_EOS])
            eos = pad = backend.token_to_id(GPT2_EOS)
            names = {"bos_token": GPT2_EOS, "eos_token": GPT2_EOS, "unk_token": GPT2_EOS}
        elif kind == "neox":  # a tokenizers JSON; eos <|endoftext|>, pad <|padding|> (else eos)
            backend = Tokenizer.from_file(path)
            eos, pad, names = backend.token_to_id(GPT2_EOS), backend.token_to_id("<|padding|>"), {}
            pad = eos if pad is None else pad
        else:
            backend = esm_backend(path) if os.path.basename(path) == "vocab.txt" else Tokenizer.from_file(path)
            names = _special_names(os.path.dirname(path))
            eos = backend.token_to_id(names["eos_token"]) if names["eos_token"] else None
            pad = backend.token_to_id(names["pad_token"]) if names["pad_token"] else None
            pad = eos if pad is None else pad
    except Exception as e:  # tokenizers raises a bare Exception on a damaged file
        raise ParamsError(f"data preprocess --config: the tokenizer cannot be loaded ({where}): {e}; give a "
                          "tokenizer saved by Hugging Face tokenizers") from None
    if eos_override is not None:
        eos = pad = eos_override
    if pad_override is not None:
        pad = pad_override
        if not eos:
            eos = pad
        elif pad != eos and kind == "gpt2":
            pad = eos  # the vendor keeps gpt2's pad equal to its eos
    special = {k: v for k, v in names.items() if k != "chat_template" and v is not None}
    return LoadedTokenizer(backend, eos, pad, backend.get_vocab_size(with_added_tokens=True), names.get("sep_token"),
                           names.get("chat_template"), special)
