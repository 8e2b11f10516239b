"""``cs-run generate``: continue prompts with a decoder checkpoint (models/common/generate.py does the decoding).

The model is the params file's ``model:`` section with the checkpoint's weights; the text goes through a
``tokenizers`` tokenizer (a ``tokenizer.json``, or a Hugging Face folder holding one, whose
``generation_config.json`` or ``config.json`` also gives the eos ids). Decoding is greedy unless a
temperature, top_k or top_p is given, on the command line or as the Model Zoo's inference keys of the
``model:`` section (``temperature``, ``top_k``, ``top_p``, ``max_tokens``), as the Model Zoo decides.
Note: the Model Zoo's sampler looks at the 100 most likely tokens when top_k is not set (a Cerebras
performance shortcut); here every token is a candidate then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import click
import torch
import yaml

from cs_run._logging import setup_console_logging
from cs_run.errors import CheckpointError, ParamsError
from cs_run.frontends.help_format import Flag, HelpCommand
from cs_run.models.common.decoder import DecoderLM
from cs_run.models.common.generate import GenerationConfig, generate
from cs_run.models.common.hf import build, load_checkpoint_model
from cs_run.models.dpo.model import decoder_of
from cs_run.registry import apply_model_defaults

__all__ = ["generate_command", "load_tokenizer", "load_decoder", "model_keys", "prefix_token_id", "read_params"]


def load_tokenizer(path: Path) -> tuple[Any, tuple[int, ...]]:
    """(tokenizer, eos ids) of a ``tokenizer.json`` or a folder holding one (eos ids from its
    ``generation_config.json``, else ``config.json``; none for a bare file)."""
    try:
        from tokenizers import Tokenizer  # noqa: PLC0415 - optional package
    except ImportError:
        raise ParamsError("--tokenizer: needs the 'tokenizers' package; pip install tokenizers") from None
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise ParamsError(f"--tokenizer: {file} not found; give a tokenizer.json or a Hugging Face folder with one")
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own error types
        raise ParamsError(f"--tokenizer: {file} is not a tokenizers JSON file ({str(e).splitlines()[0]})") from None
    eos: tuple[int, ...] = ()
    for name in ("generation_config.json", "config.json"):
        config = path / name if path.is_dir() else None
        if config is not None and config.is_file():
            try:
                value = json.loads(config.read_text()).get("eos_token_id")
            except (ValueError, AttributeError):
                raise ParamsError(f"--tokenizer: {config} is not a JSON object; fix or remove it") from None
            if value is not None:
                eos = tuple(value) if isinstance(value, list) else (int(value),)
                break
    return tokenizer, eos


def prefix_token_id(path: Path, tokenizer: Any) -> Optional[int]:
    """The BOS id of a Hugging Face tokenizer folder (``tokenizer_config.json``'s ``bos_token``), or None."""
    config = path / "tokenizer_config.json" if path.is_dir() else None
    if config is None or not config.is_file():
        return None
    try:
        bos = json.loads(config.read_text()).get("bos_token")
    except (ValueError, AttributeError):
        raise ParamsError(f"--tokenizer: {config} is not a JSON object; fix or remove it") from None
    bos = bos.get("content") if isinstance(bos, dict) else bos
    return tokenizer.token_to_id(bos) if isinstance(bos, str) else None


def read_params(params: Path) -> dict:
    """The params file as written (a mapping), or one error naming it."""
    if not params.is_file():
        raise ParamsError(f"--params: {params} not found")
    try:
        raw = yaml.safe_load(params.read_text())
    except yaml.YAMLError as e:
        raise ParamsError(f"{params}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{params}: expected a mapping of params sections, got {type(raw).__name__}")
    return raw


def model_keys(raw: dict, params: Path) -> dict:
    """The ``model:`` keys of a params file, flat or in the trainer form (``trainer.init.model``, named by
    ``model_name``), its model named as a run would name it."""
    trainer = raw.get("trainer")
    if isinstance(trainer, dict):
        model = dict((trainer.get("init") or {}).get("model") or {})
        if "name" not in model and "model_name" in model:
            model["name"] = model.pop("model_name")
        raw = {"model": model}
    model = apply_model_defaults(raw).get("model")
    if not isinstance(model, dict) or "name" not in model:
        raise ParamsError(f"{params}: no model: section with a name (the model to build)")
    return model


def load_decoder(params: Path, checkpoint: Path, device: str = "CPU") -> tuple[DecoderLM, dict]:
    """The decoder LM (``model.model``) of a params file's ``model:`` with a checkpoint's weights, on ``device``
    (CPU or GPU), and the keys."""
    if device.upper() == "GPU" and not torch.cuda.is_available():
        raise ParamsError("--device GPU: no CUDA device is available; use --device CPU")
    keys, prefix = decoder_of(model_keys(read_params(params), params), str(params))  # a DPO run's: its policy
    if not checkpoint.exists():
        raise CheckpointError(f"--checkpoint_path: {checkpoint} not found")
    lora = keys.pop("lora_params", None)  # a LoRA run's adapters are folded into the weights it generates with
    if not isinstance(getattr(build(keys, meta=True), "model", None), DecoderLM):
        raise ParamsError(f"{params}: model.name {keys['name']!r} is not a decoder language model; generate "
                          "needs one of the decoder families (gpt2, llama, mistral, ...)")
    lm = load_checkpoint_model(checkpoint, keys, lora=lora, prefix=prefix).model
    return lm.to("cuda" if device.upper() == "GPU" else "cpu").eval(), keys


def _prompts(prompt: tuple[str, ...], prompt_file: Optional[Path]) -> list[str]:
    texts = list(prompt)
    if prompt_file is not None:
        try:
            lines = prompt_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ParamsError(f"--prompt_file: {prompt_file}: cannot read it ({e})") from None
        texts += [line for line in lines if line.strip()]
    if not texts:
        raise click.UsageError("give --prompt TEXT or --prompt_file F (one prompt per line)")
    return texts


@click.command("generate", cls=HelpCommand, examples=[
    ('greedy continuations of two prompts',
     'cs-run generate --params params.yaml --checkpoint_path checkpoint_100.mdl'
     ' --tokenizer tokenizer.json --prompt "def main" --prompt "import"'),
    ('sampled, 32 new tokens each, stopping at a blank line',
     'cs-run generate --params params.yaml --checkpoint_path checkpoint_100.mdl'
     ' --tokenizer tokenizer.json --prompt "Once" --temperature 0.8 --top_p 0.9 --seed 1 --max_new_tokens 32 --stop "\\n\\n"'),
])
@click.option("--params", "-p", "params", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Params YAML whose model: section the checkpoint's weights fit.")
@click.option("--checkpoint_path", type=click.Path(path_type=Path), required=True, help="The model's checkpoint.")
@click.option("--tokenizer", type=click.Path(path_type=Path), required=True,
              help="A tokenizer.json, or a Hugging Face folder with one (its eos ids are used too).")
@click.option("--prompt", cls=Flag, default_text='none (give --prompt or --prompt_file)', multiple=True, help="A prompt (repeatable).")
@click.option("--prompt_file", cls=Flag, default_text='none',
              type=click.Path(dir_okay=False, path_type=Path), help="Prompts, one per line.")
@click.option("--max_new_tokens", cls=Flag, default_text='model.max_tokens, else 64',
              type=click.IntRange(min=1), help="Tokens to add per prompt.")
@click.option("--temperature", cls=Flag, default_text="greedy, unless the params' model.temperature",
              type=click.FloatRange(min=0, min_open=True), help="Sample at this temperature.")
@click.option("--top_k", cls=Flag, default_text='all tokens, unless model.top_k',
              type=click.IntRange(min=1), help="Sample from the k most likely tokens.")
@click.option("--top_p", cls=Flag, default_text='1, unless model.top_p', type=click.FloatRange(min=0, max=1, min_open=True),
              help="Sample from the most likely tokens whose probability reaches p.")
@click.option("--seed", cls=Flag, default_text='random', type=int, help="Seed of the sampling.")
@click.option("--eos_token_id", cls=Flag, default_text="the tokenizer folder's eos ids",
              type=int, multiple=True, help="Stop a sequence at this token (repeatable).")
@click.option("--stop", cls=Flag, default_text='none',
              multiple=True, help="Stop a sequence at this string, cut from the text (repeatable).")
@click.option("--batch_size", cls=Flag, default_text='all prompts at once',
              type=click.IntRange(min=1), help="Prompts decoded together, left-padded.")
@click.option("--device", type=click.Choice(["CPU", "GPU"], case_sensitive=False), default="CPU", show_default=True)
def generate_command(params: Path, checkpoint_path: Path, tokenizer: Path, prompt: tuple[str, ...],
                     prompt_file: Optional[Path], max_new_tokens: Optional[int], temperature: Optional[float],
                     top_k: Optional[int], top_p: Optional[float], seed: Optional[int],
                     eos_token_id: tuple[int, ...], stop: tuple[str, ...], batch_size: Optional[int],
                     device: str) -> None:
    """Continue prompts with a decoder checkpoint (greedy or sampled, KV-cached); one JSON line per prompt.

    Each line holds the prompt, the new text, its tokens and why it ended (eos, stop_string, length). Decoding
    is greedy unless --temperature, --top_k or --top_p is given (or the params' model.temperature, top_k,
    top_p); progress and tokens/s go to the log."""
    setup_console_logging()
    texts = _prompts(prompt, prompt_file)
    tok, folder_eos = load_tokenizer(tokenizer)
    lm, keys = load_decoder(params, checkpoint_path, device)
    temperature = temperature if temperature is not None else keys.get("temperature")
    top_k = top_k if top_k is not None else keys.get("top_k")
    top_p = top_p if top_p is not None else keys.get("top_p")
    try:
        config = GenerationConfig(
            max_new_tokens=max_new_tokens or keys.get("max_tokens") or 64,
            do_sample=any((temperature, top_k, top_p)), temperature=temperature or 1.0,  # 0/None: unset (the vendor's)
            top_k=top_k or None, top_p=top_p or None, seed=seed, eos_token_ids=eos_token_id or folder_eos, stop_strings=stop,
            pad_token_id=(eos_token_id or folder_eos or (0,))[0], batch_size=batch_size)
        prompts = [tok.encode(text).ids for text in texts]
        results = generate(lm, prompts, config, lambda ids: tok.decode(ids, skip_special_tokens=True))
    except ValueError as e:
        raise ParamsError(f"generate: {e}") from None
    for text, result in zip(texts, results):
        click.echo(json.dumps({"prompt": text, "text": result.text, "tokens": result.tokens,
                               "finish_reason": result.finish_reason}, ensure_ascii=False))
