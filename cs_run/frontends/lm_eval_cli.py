"""``cs-run lm-eval``: EleutherAI's lm-evaluation-harness on a decoder checkpoint (the Model Zoo's
``cszoo lm_eval`` / EleutherEvalHarness), through :func:`make_lm`, an ``lm_eval`` ``TemplateLM``.

Requests are tokenized as lm-evaluation-harness' Hugging Face backend tokenizes them (``TemplateLM``'s
context/continuation split; the tokenizer's own special tokens; an empty context gets the BOS id, else
the EOS id) and scored by :mod:`cs_run.models.common.scoring` (``loglikelihood``, and
``loglikelihood_rolling`` over the harness' own rolling windows, which the Model Zoo refuses) and
:mod:`cs_run.models.common.generate` (``generate_until``: the harness' stop sequences plus the EOS text,
``max_gen_toks`` (256 by default), the context cut to leave room for them). ``lm_eval`` is the optional
``eval`` extra, imported on use. Tasks may come from ``--include_path`` folders of task YAML files, whose
datasets may be local files (``dataset_path: json`` with ``data_files``): nothing is downloaded then.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

import click

from cs_run._logging import setup_console_logging
from cs_run.errors import ParamsError
from cs_run.frontends.generate_cli import load_decoder, load_tokenizer, prefix_token_id, read_params
from cs_run.frontends.help_format import Flag, HelpCommand
from cs_run.models.common.decoder import DecoderLM
from cs_run.models.common.generate import GenerationConfig, generate
from cs_run.models.common.scoring import loglikelihoods

logger = logging.getLogger(__name__)

__all__ = ["lm_eval_command", "make_lm"]


def _lm_eval():
    """lm-evaluation-harness, loaded on use (a missing one is the exit handler's one line naming the extra)."""
    import lm_eval  # the optional 'eval' extra
    import lm_eval.api.model
    import lm_eval.models.utils
    import lm_eval.tasks
    import lm_eval.utils

    return lm_eval


def make_lm(lm: DecoderLM, tokenizer: Any, eos_ids: tuple[int, ...], prefix_id: Optional[int] = None,
            batch_size: int = 8, generation: Optional[dict] = None) -> Any:
    """An ``lm_eval`` LM of the decoder ``lm`` and a ``tokenizers`` tokenizer (``eos_ids[0]`` is its EOS).
    ``generation`` (the vendor's eeh_args ``max_tokens``, ``temperature``, ``top_k``, ``top_p``) overrides
    what the tasks ask of generate_until."""
    overrides = {k: v for k, v in (generation or {}).items() if v is not None}
    if "max_tokens" in overrides:
        overrides["max_gen_toks"] = overrides.pop("max_tokens")
    if {"temperature", "top_k", "top_p"} & set(overrides):
        overrides["do_sample"] = True
    harness = _lm_eval()
    utils, model_utils = harness.utils, harness.models.utils
    max_length = lm.embedding_layer.max_position_embeddings

    class CsRunLM(harness.api.model.TemplateLM):
        """lm-evaluation-harness' view of a cs-run decoder."""

        def __init__(self) -> None:
            super().__init__()
            self.batch_size = batch_size
            self.max_length = max_length

        @property
        def eot_token_id(self) -> int:
            return eos_ids[0]

        @property
        def prefix_token_id(self) -> int:
            return prefix_id if prefix_id is not None else eos_ids[0]

        def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs) -> list[int]:
            return tokenizer.encode(string, add_special_tokens=add_special_tokens is not False).ids

        def tok_decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
            return tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
            return loglikelihoods(lm, [(context, continuation) for _, context, continuation in requests], max_length,
                                  batch_size)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
            windows, owners = [], []
            for i, (text,) in enumerate(req.args for req in requests):
                for window in utils.get_rolling_token_windows(token_list=self.tok_encode(text),
                                                              prefix_token=self.prefix_token_id,
                                                              max_seq_len=max_length, context_len=1):
                    windows.append(utils.make_disjoint_window(window))
                    owners.append(i)
            totals = [0.0] * len(requests)
            for owner, (logprob, _) in zip(owners, loglikelihoods(lm, windows, max_length, batch_size)):
                totals[owner] += logprob
            return totals

        def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
            out = []
            eos_text = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
            for context, gen_kwargs in (req.args for req in requests):
                kwargs = model_utils.normalize_gen_kwargs({**gen_kwargs, **overrides}, 256)
                until = model_utils.handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
                new = kwargs.pop("max_gen_toks")
                if new >= max_length:
                    raise ParamsError(f"generate_until: max_gen_toks {new} leaves no room for a context in the "
                                      f"model's max_position_embeddings ({max_length}); lower it in the task")
                temperature = float(kwargs.get("temperature", 1.0))  # sampling without one: 1.0, as transformers
                sample = bool(kwargs.get("do_sample")) and temperature > 0
                config = GenerationConfig(
                    max_new_tokens=new, do_sample=sample, temperature=temperature if sample else 1.0,
                    top_k=kwargs.get("top_k") if sample else None, top_p=kwargs.get("top_p") if sample else None,
                    seed=1234, eos_token_ids=eos_ids, stop_strings=tuple(u for u in until if u),
                    pad_token_id=eos_ids[0])
                prompt = self.tok_encode(context)[-(max_length - new):]
                text = generate(lm, [prompt], config, self.tok_decode)[0].text
                out.append(model_utils.postprocess_generated_text(text, until, None))
            return out

    return CsRunLM()


_EEH_ARGS = {"tasks", "num_fewshot", "limit", "include_path", "output_path", "max_tokens", "temperature", "top_k",
             "top_p", "verbosity", "seed"}
_EEH_NOTED = {"keep_data_dir", "shuffle", "num_workers", "data_dir", "flags", "max_sequence_length"}
"""The EleutherEvalHarness callback's own keys that steer the vendor's data writing and CSX run: no effect here
(the harness' requests go to the model directly)."""


def eeh_callbacks(raw: dict, params: Path) -> list[dict]:
    """The ``EleutherEvalHarness`` callbacks of a trainer-form params file (``trainer.init.callbacks``), each
    checked: ``eeh_args`` with ``tasks``, and only the keys cs-run honours (one error naming another)."""
    trainer = raw.get("trainer")
    callbacks = ((trainer.get("init") or {}).get("callbacks") or []) if isinstance(trainer, dict) else []
    found = []
    for i, entry in enumerate(callbacks if isinstance(callbacks, list) else []):
        if not (isinstance(entry, dict) and "EleutherEvalHarness" in entry):
            continue
        where = f"{params}: trainer.init.callbacks[{i}].EleutherEvalHarness"
        args = entry["EleutherEvalHarness"] or {}
        eeh = args.get("eeh_args") if isinstance(args, dict) else None
        if not isinstance(eeh, dict) or not eeh.get("tasks"):
            raise ParamsError(f"{where}.eeh_args.tasks: missing; name the harness tasks to run")
        for key in eeh:
            if key not in _EEH_ARGS and eeh[key] not in (None, False):
                raise ParamsError(f"{where}.eeh_args.{key}: not supported by cs-run lm-eval (it takes "
                                  f"{', '.join(sorted(_EEH_ARGS))}); remove it")
        for key in args:
            if key not in {"eeh_args", "batch_size", "eos_id", "pretrained_model_name_or_path", "tokenizer_file_path",
                           *_EEH_NOTED}:
                raise ParamsError(f"{where}.{key}: unknown key of the EleutherEvalHarness callback")
        found.append(args)
    return found


def _run_one(lm: DecoderLM, tokenizer: Path, eos: tuple[int, ...], batch_size: int, eeh: dict,
             include_path: Optional[Path], output_path: Optional[Path]) -> None:
    harness = _lm_eval()
    tok, folder_eos = load_tokenizer(tokenizer)
    eos = eos or folder_eos
    if not eos:
        raise ParamsError("--eos_token_id: the tokenizer gives no EOS id (no config.json eos_token_id beside it); "
                          "give one")
    tasks = eeh["tasks"]
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]
    manager = harness.tasks.TaskManager(include_path=str(include_path) if include_path else None)
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        raise ParamsError(f"--tasks: unknown task(s) {', '.join(unknown)}; give a harness task name or add its YAML "
                          "folder with --include_path")
    limit = eeh.get("limit")
    generation = {k: eeh.get(k) for k in ("max_tokens", "temperature", "top_k", "top_p")}
    model = make_lm(lm, tok, eos, prefix_token_id(tokenizer, tok), batch_size, generation)
    results = harness.simple_evaluate(model=model, tasks=names, num_fewshot=eeh.get("num_fewshot"),
                                      limit=int(limit) if limit and limit >= 1 else limit, task_manager=manager,
                                      log_samples=False)
    click.echo(harness.utils.make_table(results))
    if output_path is not None:
        output_path.write_text(json.dumps({"results": results["results"], "configs": results.get("configs", {})},
                                          indent=2, default=str) + "\n")


@click.command("lm-eval", cls=HelpCommand, examples=[
    ('two harness tasks on a checkpoint',
     'cs-run lm-eval --params params.yaml --checkpoint_path checkpoint_100.mdl --tokenizer tokenizer.json --tasks hellaswag,arc_easy'),
    ('a task of your own from local files (no network), 100 examples',
     'cs-run lm-eval --params params.yaml --checkpoint_path checkpoint_100.mdl'
     ' --tokenizer tokenizer.json --tasks my_task --include_path x.dir --limit 100'),
])
@click.option("--params", "-p", "params", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Params YAML whose model: section the checkpoint's weights fit; a trainer-form file may hold "
                   "EleutherEvalHarness callbacks, run when --tasks is not given.")
@click.option("--checkpoint_path", type=click.Path(path_type=Path), required=True, help="The model's checkpoint.")
@click.option("--tokenizer", cls=Flag, default_text="the callback's tokenizer_file_path", type=click.Path(path_type=Path),
              help="A tokenizer.json, or a Hugging Face folder with one (its eos ids are used too); default: the "
                   "callback's tokenizer_file_path or pretrained_model_name_or_path.")
@click.option("--tasks", cls=Flag, default_text="the params' EleutherEvalHarness callbacks",
              help="Comma-separated lm-evaluation-harness task names.")
@click.option("--include_path", cls=Flag, default_text="the harness' own tasks only",
              type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="A folder of task YAML files to add to the harness' own.")
@click.option("--num_fewshot", cls=Flag, default_text="the task's",
              type=click.IntRange(min=0), help="Few-shot examples per prompt (the task's default).")
@click.option("--limit", cls=Flag, default_text='every example', type=float, help="Examples per task: a count, or a fraction below 1.")
@click.option("--batch_size", cls=Flag, default_text="the callback's, else 8",
              type=click.IntRange(min=1), help="Requests per forward.")
@click.option("--eos_token_id", cls=Flag, default_text="the callback's eos_id, else the tokenizer folder's",
              type=int, multiple=True, help="The EOS id(s).")
@click.option("--output_path", cls=Flag, default_text='none (printed only)',
              type=click.Path(dir_okay=False, path_type=Path), help="Write the results as JSON.")
@click.option("--device", type=click.Choice(["CPU", "GPU"], case_sensitive=False), default="CPU", show_default=True)
def lm_eval_command(params: Path, checkpoint_path: Path, tokenizer: Optional[Path], tasks: Optional[str],
                    include_path: Optional[Path], num_fewshot: Optional[int], limit: Optional[float],
                    batch_size: Optional[int], eos_token_id: tuple[int, ...], output_path: Optional[Path],
                    device: str) -> None:
    """Evaluate a decoder checkpoint on lm-evaluation-harness tasks (needs the 'eval' extra).

    Prints the harness' results table per evaluation; --output_path also writes the results as JSON. Without
    --tasks, runs the params file's EleutherEvalHarness callbacks (the Model Zoo's trainer form)."""
    setup_console_logging()
    _lm_eval()  # a missing harness first: nothing below can run without it
    raw = read_params(params)
    if tasks:
        runs = [{"eeh_args": {"tasks": tasks, "num_fewshot": num_fewshot, "limit": limit}}]
    else:
        runs = eeh_callbacks(raw, params)
        if not runs:
            raise click.UsageError(f"give --tasks, or a params file with an EleutherEvalHarness callback ({params} "
                                   "has none)")
    lm, _ = load_decoder(params, checkpoint_path, device)
    for run in runs:
        eeh = dict(run["eeh_args"])
        if num_fewshot is not None:
            eeh["num_fewshot"] = num_fewshot
        if limit is not None:
            eeh["limit"] = limit
        source = tokenizer or run.get("tokenizer_file_path") or run.get("pretrained_model_name_or_path")
        if source is None:
            raise ParamsError("--tokenizer: missing; give a tokenizer.json or a Hugging Face folder")
        path = Path(source)
        if not path.exists():
            raise ParamsError(f"--tokenizer: {path} not found; give a local tokenizer.json or Hugging Face folder "
                              "(cs-run downloads nothing)")
        eos = eos_token_id or ((run["eos_id"],) if isinstance(run.get("eos_id"), int) else tuple(run.get("eos_id") or ()))
        out = output_path or (Path(eeh["output_path"]) if eeh.get("output_path") else None)
        if out is not None and out.suffix != ".json":  # the vendor's output_path may be a folder
            out = out / "results.json"
            out.parent.mkdir(parents=True, exist_ok=True)
        include = include_path or (Path(eeh["include_path"]) if eeh.get("include_path") else None)
        _run_one(lm, path, eos, batch_size or run.get("batch_size") or 8, eeh, include, out)
