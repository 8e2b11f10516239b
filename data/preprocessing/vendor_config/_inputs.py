"""The config's inputs: which files, their records, the read hook, and the vendor's read chunks.

Files are found as the vendor's tool finds them: every ``*.jsonl``, ``*.json.gz``, ``*.jsonl.zst``,
``*.txt``, ``*.parquet`` under the source folder, recursively, in sorted order. A ``*.jsonl.gz`` is not
one of them (the vendor skips it, so cs-run does too, with a warning naming it: rename it ``.json.gz``).
A record keeps its columns, the hook's ``*_key`` ones added where missing (a number among them becomes its
string), all counted in the read chunk's size; a .txt line is a
record whose ``text`` column is the line. Records are grouped into read chunks of about
``read_chunk_size`` bytes, counted as the vendor counts them, because the output files are named
after the chunk count. A line that is not JSON is one error with its file and line.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import numbers
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from cs_run.errors import DataError, ParamsError

__all__ = ["HOOKS", "MODE_HOOKS", "RecordError", "find_files", "read_chunks", "resolve_hook"]

SUFFIXES = (".jsonl", ".json.gz", ".jsonl.zst", ".txt", ".parquet")
logger = logging.getLogger(__name__)
_VENDOR_HOOKS = "cerebras.modelzoo.data_preparation.data_preprocessing.hooks"


class RecordError(ValueError):
    """A record a hook cannot turn into turns (the vendor's hooks raise ValueError): one line with its file:line."""


def text_read_hook(example: dict, **kwargs: Any) -> list[dict]:
    """One text region: the record's ``text_key`` value, stripped (the vendor's text_read_hook)."""
    key = kwargs.get("text_key")
    if key is None:
        raise ParamsError("data preprocess --config: text_read_hook needs read_hook_kwargs.text_key")
    return [{"content": [{"text": (example.get(key) or "").strip()}]}]


def prompt_completion_text_read_hook(example: dict, **kwargs: Any) -> list[dict]:
    """A prompt turn and a completion turn from ``prompt_key`` / ``completion_key`` (not stripped)."""
    prompt, completion = kwargs.get("prompt_key"), kwargs.get("completion_key")
    if prompt is None or completion is None:
        raise ParamsError("data preprocess --config: prompt_completion_text_read_hook needs read_hook_kwargs.prompt_key "
                          "and completion_key")
    return [{"type": "prompt", "content": [{"text": example.get(prompt)}]},
            {"type": "completion", "content": [{"text": example.get(completion)}]}]


def chat_read_hook(example: dict, **kwargs: Any) -> list[dict]:
    """A conversation's turns (an optional system prompt, then user / assistant pairs), each stripped; a
    record with an odd number of turns or two turns in a row by one role gives nothing (the vendor's rules)."""
    key, role_key, content_key = (kwargs.get(k) for k in ("multi_turn_key", "multi_turn_role_key",
                                                           "multi_turn_content_key"))
    if key is None or role_key is None or content_key is None:
        raise ParamsError("data preprocess --config: chat_read_hook needs read_hook_kwargs.multi_turn_key, "
                          "multi_turn_role_key and multi_turn_content_key")
    turns = example.get(key) or []
    if not turns:
        return []
    out = []
    if turns[0].get(role_key) == "system":
        if turns[0].get(content_key):
            out.append({"type": "system", "content": [{"text": turns[0].get(content_key)}]})
        turns = turns[1:]
    if len(turns) % 2:
        return []
    for user, assistant in zip(turns[::2], turns[1::2]):
        if user.get(role_key) == assistant.get(role_key):
            return []
        for turn in (user, assistant):
            content = turn.get(content_key)
            out.append({"type": turn.get(role_key), "content": [{"text": content.strip() if content else content}]})
    return out


def dpo_read_hook(example: dict, **kwargs: Any) -> list[dict]:
    """Prompt, chosen and rejected turns: from three strings (``prompt_key`` given), from two strings split at
    the last ``assistant_role`` (default ``assistant:``, no prompt_key), or from two chat lists (the first
    message is the prompt, the second the answer). Anything else gives nothing."""
    prompt_key, chosen_key, rejected_key = (kwargs.get(k) for k in ("prompt_key", "chosen_key", "rejected_key"))
    role = kwargs.get("assistant_role", "assistant:")

    def turns(prompt, chosen, rejected):
        return [{"type": t, "content": [{"text": v}]} for t, v in
                (("prompt", prompt), ("chosen", chosen), ("rejected", rejected))]

    if all(isinstance(k, str) and isinstance(v, str) for k, v in example.items()):
        if prompt_key:
            return turns(example.get(prompt_key, ""), example.get(chosen_key, ""), example.get(rejected_key, ""))
        chosen, rejected = example.get(chosen_key, ""), example.get(rejected_key, "")
        cut = chosen.lower().rfind(role)
        if cut == -1:
            return []
        cut += len(role)
        return turns(chosen[:cut], chosen[cut:], rejected[cut:])
    if all(isinstance(k, str) and isinstance(v, list) for k, v in example.items()):
        chosen, rejected = example.get(chosen_key), example.get(rejected_key)
        if not chosen or not rejected:
            raise DataError(f"data preprocess --config: a DPO record has no {chosen_key if not chosen else rejected_key} "
                            "list; give both chosen and rejected conversations")
        return turns(chosen[0]["content"], chosen[1]["content"], rejected[1]["content"])
    return []


def nlg_read_hook(example: dict, **kwargs: Any) -> list[dict]:
    """A context turn and a completion turn from ``context_key`` / ``completion_key``: token id lists, kept
    as they are (mode nlg reads pre-tokenized records); a missing key gives "", as the vendor's hook."""
    context, completion = kwargs.get("context_key"), kwargs.get("completion_key")
    if context is None or completion is None:
        raise ParamsError("data preprocess --config: nlg_read_hook needs read_hook_kwargs.context_key and "
                          "completion_key")
    return [{"type": "context", "content": [{"text": example.get(context, "")}]},
            {"type": "completion", "content": [{"text": example.get(completion, "")}]}]


def _llava_keys(kwargs: dict, name: str) -> tuple:
    for key in ("multi_turn_key", "image_key", "phase", "image_token"):
        if kwargs.get(key) is None:
            raise ParamsError(f"data preprocess --config: {name} needs read_hook_kwargs.{key}")
    return (kwargs["multi_turn_key"], kwargs["image_key"], kwargs["image_token"], kwargs["phase"],
            kwargs.get("multi_turn_role_key", "from"), kwargs.get("multi_turn_content_key", "value"))


def _llava_user(content: str, image_path, image_token: str, phase, strip: bool) -> tuple[list, list]:
    """A user turn's parts: the image first where the text holds the image token (once at most), then the text
    around it; phase 1 drops that text (the caption alone is learned)."""
    parts = content.split(image_token)
    if len(parts) > 2:
        raise RecordError(f"has {len(parts) - 1} image tokens {image_token!r} in one user turn; the llava hooks take "
                          "one per turn")
    if len(parts) == 1:
        if not strip:  # the vendor's prompt hook gives this turn no drop mask, and its tool stops on the mismatch
            raise RecordError(f"has a prompt turn without the image token {image_token!r}; "
                              "finetuning_llava_hook_prompt_completion reads one image per prompt")
        return [{"text": content.strip()}], [False]
    text = parts[0].strip() + parts[1].strip()
    if not text:
        return [{"image": image_path}], [False]
    return [{"image": image_path}, {"text": text}], [False, phase == 1]


def _llava_turns(example: dict, kwargs: dict, name: str, roles: dict) -> list[dict]:
    key, image_key, image_token, phase, role_key, content_key = _llava_keys(kwargs, name)
    image_path = example.get(image_key)
    if roles["user"] == "prompt" and not image_path:
        raise RecordError(f"has no {image_key!r} (finetuning_llava_hook_prompt_completion needs an image per record)")
    out = []
    for turn in example.get(key) or []:
        who = turn.get(role_key)
        role = roles.get("user" if who in ("human", "user") else "assistant" if who in ("gpt", "assistant") else who)
        if role is None:
            raise RecordError(f"has a turn whose {role_key!r} is {who!r}; give human / user, gpt / assistant"
                              + (" or system" if "system" in roles else ""))
        if role == "system":
            text = (turn.get(content_key) or "").strip()
            parts, drop = ([{"text": text}], [False]) if text else ([], [])
        elif role == roles["user"]:
            parts, drop = _llava_user(turn[content_key], image_path, image_token, phase, roles["user"] == "user")
        else:
            content = turn[content_key]
            if image_token in content:
                raise RecordError(f"has the image token {image_token!r} in an assistant turn; images go in user turns")
            parts, drop = [{"text": content.strip() if roles["user"] == "user" else content}], [False]
        out.append({"type": role, "content": parts, "semantic_drop_mask": drop})
    return out


def finetuning_llava_hook(example: dict, **kwargs: Any) -> list[dict]:
    """LLaVA conversations as chat turns (system / user / assistant, stripped): a user turn's image token becomes
    an image part ahead of its text; phase 1 drops that text (the vendor's finetuning_llava_hook)."""
    return _llava_turns(example, kwargs, "finetuning_llava_hook",
                        {"user": "user", "assistant": "assistant", "system": "system"})


def finetuning_llava_hook_prompt_completion(example: dict, **kwargs: Any) -> list[dict]:
    """LLaVA conversations as prompt / completion turns (not stripped; every record needs an image)."""
    return _llava_turns(example, kwargs, "finetuning_llava_hook_prompt_completion",
                        {"user": "prompt", "assistant": "completion"})


HOOKS: dict[str, Callable[..., list[dict]]] = {
    "dpo_read_hook": dpo_read_hook,
    "chat_read_hook": chat_read_hook,
    "text_read_hook": text_read_hook,
    "prompt_completion_text_read_hook": prompt_completion_text_read_hook,
    "nlg_read_hook": nlg_read_hook,
    "finetuning_llava_hook": finetuning_llava_hook,
    "finetuning_llava_hook_prompt_completion": finetuning_llava_hook_prompt_completion,
}
MODE_HOOKS = {"pretraining": ("text_read_hook",), "finetuning": ("prompt_completion_text_read_hook", "chat_read_hook"),
              "dpo": ("dpo_read_hook",), "nlg": ("nlg_read_hook",),
              "multimodal": ("finetuning_llava_hook", "finetuning_llava_hook_prompt_completion")}
"""The vendor's read hooks cs-run runs, by function name (the module is the vendor's hooks module); multimodal:
finetuning with dataset.is_multimodal."""


def resolve_hook(name: str, mode: str, where: str) -> Callable[..., list[dict]]:
    """The hook a dotted name (``module:function`` or ``module.function``) names, for ``mode``."""
    module, _, func = name.rpartition(":") if ":" in name else name.rpartition(".")
    usable = MODE_HOOKS.get(mode, ())
    if module == _VENDOR_HOOKS and func in usable:
        return HOOKS[func]
    raise ParamsError(f"data preprocess --config: processing.read_hook {name!r} is not a hook cs-run runs in mode {mode} "
                      f"({where}); use {' or '.join(f'{_VENDOR_HOOKS}:{h}' for h in usable)}")


def find_files(source: str) -> list[str]:
    """The input files under ``source``, sorted, as the vendor lists them."""
    found = {str(p) for suffix in SUFFIXES for p in Path(source).rglob(f"*{suffix}")}
    for skipped in sorted(Path(source).rglob("*.jsonl.gz")):
        logger.warning("data preprocess --config: %s is not read (the Model Zoo's tool reads .json.gz, not .jsonl.gz; "
                       "rename it to include it)", skipped)
    return sorted(found)


def _data_size(value: Any) -> int:
    """Bytes of a value as the vendor's reader counts them (utf-8 text, sys.getsizeof of numbers)."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_data_size(v) for v in value)
    if isinstance(value, dict):
        return sum(_data_size(k) + _data_size(v) for k, v in value.items())
    if isinstance(value, (int, float, bool, complex)):
        return sys.getsizeof(value)
    return 0


def _open_text(path: str) -> io.TextIOBase:
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    if path.endswith(".zst"):
        try:
            import zstandard  # noqa: PLC0415  (optional: only .zst inputs need it)
        except ImportError:
            raise ParamsError(f"data preprocess --config: {path} is zstandard-compressed and the zstandard package "
                              "is not installed; pip install zstandard or decompress it") from None
        return io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")), encoding="utf-8")
    return open(path, encoding="utf-8")


def _rows(path: str, skip_bad: bool = False) -> Iterator[tuple[int, dict]]:
    """The file's records as dicts, with their line (row, for parquet) numbers."""
    try:
        if path.endswith(".parquet"):
            try:
                import pyarrow.parquet as pq  # noqa: PLC0415  (optional: only .parquet inputs need it)
            except ImportError:
                raise ParamsError(f"data preprocess --config: {path} is parquet and pyarrow is not installed; pip "
                                  "install pyarrow") from None
            yield from enumerate(pq.read_table(path).to_pylist(), 1)
            return
        with _open_text(path) as f:
            if path.endswith(".txt"):
                for number, line in enumerate(f.read().splitlines(), 1):
                    yield number, {"text": line}
                return
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    if skip_bad:  # processing.UNSAFE_skip_jsonl_decoding_errors: the line is left out, named
                        logger.warning("data preprocess --config: %s:%d is not a JSON line (%s); skipped", path, number,
                                       e.msg)
                        continue
                    raise DataError(f"data preprocess --config: {path}:{number} is not a JSON line ({e.msg}); fix the "
                                    "line or remove it") from None
                if not isinstance(row, dict):
                    raise DataError(f"data preprocess --config: {path}:{number} is a JSON {type(row).__name__}, not an "
                                    "object; each line must be one {\"key\": value} record")
                yield number, row
    except UnicodeDecodeError as e:
        raise DataError(f"data preprocess --config: {path} is not UTF-8 text ({e.reason} at byte {e.start}); save it as "
                        "UTF-8") from None
    except (OSError, EOFError) as e:
        raise DataError(f"data preprocess --config: {path} cannot be read ({e}); check the file") from None


def read_chunks(files: list[str], keys: list[str], hook: Callable[..., list[dict]], hook_kwargs: dict,
                chunk_size: int, skip_bad: bool = False) -> Iterator[list[tuple[str, list[dict]]]]:
    """The hook's output per record (with the record's ``file:line``), grouped into the vendor's read chunks.

    A chunk closes before a record that would take it past ``chunk_size`` bytes; the last chunk of a file
    continues into the next file, as the vendor's reader carries it over. A line that is not JSON is an
    error naming it, or with ``skip_bad`` (UNSAFE_skip_jsonl_decoding_errors) a warning naming it, and
    left out (the vendor's reader reads the flag and does not use it: its JSON loader stops the file there).
    """
    chunk: list[tuple[str, list[dict]]] = []
    size = 0
    for path in files:
        for number, row in _rows(path, skip_bad):
            # every column of the record, the hook's keys added where missing and numbers among them as strings (the
            # vendor's datasets map adds and converts those columns and keeps the others, which its chunk size counts)
            entry = {**row, **{k: str(row[k]) if isinstance(row.get(k), numbers.Number) else row.get(k) for k in keys}}
            entry_size = sum(_data_size(v) for v in entry.values())
            if size + entry_size > chunk_size and size != 0:
                yield chunk
                chunk, size = [], 0
            try:
                turns = hook(entry, **hook_kwargs)
            except (KeyError, IndexError, TypeError, AttributeError) as e:
                raise DataError(f"data preprocess --config: {path}:{number} does not have the shape the read hook "
                                f"{hook.__name__} reads ({type(e).__name__}: {e}); fix the record or the "
                                "read_hook_kwargs keys") from None
            except RecordError as e:
                raise DataError(f"data preprocess --config: {path}:{number} {e}; fix the record") from None
            for turn in turns if hook is not nlg_read_hook else ():  # nlg's token id lists: checked by _nlg
                for part in turn["content"]:
                    value = next(iter(part.values()))
                    if value is not None and not isinstance(value, str):
                        what = "an image path" if "image" in part else "text"
                        raise DataError(f"data preprocess --config: {path}:{number} has a {type(value).__name__} where "
                                        f"{hook.__name__} reads {what}; give a string")
            chunk.append((f"{path}:{number}", turns))
            size += _data_size(entry)  # the vendor's chunk counts the keys' bytes too
    if size > 0:
        yield chunk



def export_saved_dataset(folder: str, split, parquet: str, where: str) -> None:
    """A save_to_disk folder (its ``split`` where it is a DatasetDict) written to ``parquet``, as the vendor's
    load_dataset_wrapper writes a Hugging Face dataset before reading it."""
    import datasets  # noqa: PLC0415  (optional; the config check refused type huggingface without it)

    try:
        loaded = datasets.load_from_disk(folder)
    except (OSError, ValueError) as e:
        raise ParamsError(f"data preprocess --config: setup.data.source {folder} cannot be loaded with load_from_disk "
                          f"({where}): {e}; save it again with save_to_disk") from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded[split]
    os.makedirs(os.path.dirname(parquet), exist_ok=True)
    loaded.to_parquet(parquet)
