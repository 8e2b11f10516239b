"""The ``cs-run`` command line: parses, builds params, hands over to a runner. No training logic here.

Exit codes: 0 success, 2 usage or params error (the input is wrong), 1 a run that failed; every
failure is reported by :mod:`cs_run.exits`.
"""

from __future__ import annotations

import errno
import importlib
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Optional

import click

import cs_run
from cs_run._logging import setup_console_logging
from cs_run.errors import CsRunError, ParamsError
from cs_run.exits import ErrorGroup
from cs_run.frontends.flags import COMMAND_USES, RunOption, command_options, flag_names, flag_overrides
from cs_run.frontends.help_format import OPTIONS, Flag, HelpCommand
from cs_run.params import load_params, params_yaml, parse_override

__all__ = ["cli", "main"]

def default_params_path() -> Path:
    """The bundled fc_mnist params: what ``cs-run train`` runs when no --params is given."""
    return Path(str(resources.files("cs_run.examples") / "fc_mnist" / "params.yaml"))


UNSET = {"max_steps": "no cap", "eval_steps": "the whole eval loader", "seed": "not seeded",
         "checkpoint_path": "the newest in model_dir", "runner": "the device's runner",
         "compile_dir": "the per-user cache ($CS_RUN_CACHE_DIR, else ~/.cache/cs-run)", "compile_tier": "auto"}
"""What a runconfig key left unset (None) means, where "none" would not say it."""

SECTIONS = {"num_csx": "Replicas and sharding", "sharding": "Replicas and sharding", "offload": "Replicas and sharding",
            "collective_timeout": "Replicas and sharding", "num_workers_per_csx": "Replicas and sharding",
            "compile_dir": "CSX engine", "compile_tier": "CSX engine"}
"""The help section of a run flag that is not under Options (appliance-only flags: :data:`APPLIANCE`)."""

APPLIANCE = "Appliance only"
SECTION_NOTES = {APPLIANCE: "Checked and recorded in the resolved params; they change nothing off a Cerebras "
                            "appliance (the run log names them once)."}


def _default_text(option: RunOption) -> str:
    """Where a run flag's value comes from when it is not given: its runconfig key, else the key's default."""
    if option.kind == "bool":
        return "off"
    if option.name == "resume":
        return "from runconfig.checkpoint_path / autoload_checkpoint, else auto"
    unset = UNSET.get(option.key) or ("none" if option.default in (None, ()) else str(option.default))
    return f"from runconfig.{option.key}, else {unset}"


class _Path(click.Path):
    """click.Path that refuses an empty value (``--model_dir ''`` would be the current folder)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path (it would be the current folder); give a name", param, ctx)
        return super().convert(value, param, ctx)


def _click_option(option: RunOption):
    """A flag of the declaration as a click option (type, range, choices and help from the field)."""
    section = APPLIANCE if option.appliance_only else SECTIONS.get(option.name, OPTIONS)
    common = {"cls": Flag, "section": section, "default_text": _default_text(option)}
    if option.kind == "bool":
        return click.option(f"--{option.name}", option.dest, is_flag=True, default=None, help=option.help, **common)
    if option.kind == "int":
        kind: Any = click.IntRange(min=option.minimum, max=option.maximum)
    elif option.kind == "choice":
        kind = click.Choice(option.choices, case_sensitive=False)
    elif option.path == "dir":
        kind = _Path(file_okay=False, path_type=Path)
    elif option.path == "file":
        kind = _Path(dir_okay=False, path_type=Path)
    elif option.path == "checkpoint":  # a file, or a sharded run's checkpoint folder
        kind = _Path(path_type=Path)
    else:
        kind = str
    return click.option(f"--{option.name}", option.dest, type=kind, multiple=option.kind == "list",
                        metavar=option.metavar, help=option.help + (" (repeatable)" if option.kind == "list" else ""),
                        **common)


def run_command_options(command: str):
    """The flags of one run command: --params, --device, the declaration's flags that change something
    this command does (cs_run.frontends.flags.command_options), and --set for any other key."""
    device, device_help = "CPU", "Eager CPU or GPU, or CSX: the traced, compiled engine (on CUDA if present)."
    if COMMAND_USES[command] == ("trace",):  # validate-only, compile-only: they check the CSX engine's trace
        device, device_help = "CSX", "The CSX engine, which this command checks (CPU or GPU given: CSX all the same)."
    options = [
        click.option("--params", "-p", "params_path", type=_Path(dir_okay=False, path_type=Path), cls=Flag,
                     default_text="the bundled fc_mnist params", help="Params YAML (Model Zoo layout)."),
        click.option("--device", type=click.Choice(["CPU", "GPU", "CSX"], case_sensitive=False), default=device,
                     show_default=True, help=device_help),
        *[_click_option(option) for option in command_options(command)],
        click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", cls=Flag, default_text="none",
                     help="Override any params key, e.g. --set runconfig.log_steps=10; KEY=null removes it (repeatable). "
                          "Precedence: params file < --set < a flag."),
    ]

    def decorate(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


class RunCommand(HelpCommand):
    """A run command whose refusal of another command's flag says which commands take it."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, section_notes=SECTION_NOTES, **kwargs)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:  # its option_name is normalized: the declared spelling
            takers = [name for name in COMMAND_USES if any(f"--{o.name}" == e.option_name
                                                            for o in command_options(name))]
            if not takers:
                raise
            raise click.UsageError(f"{e.option_name} does not apply to '{ctx.command_path}'; the commands that take "
                                   f"it: {', '.join(takers)}", ctx) from None


SUBSYSTEMS = {
    "checkpoint": ("cs_run.frontends.checkpoint_cli:checkpoint", "Inspect and convert checkpoints (H5, torch pickle, safetensors)."),
    "data": ("cs_run.examples.gpt2.cli:data", "Prepare training data."),
    "exec": ("cs_run.frontends.compat.cli:exec_command", "Run a vendor script with cerebras.pytorch, cerebras_pytorch, "
             "modelzoo.common.pytorch and cerebras.modelzoo resolved to cs-run (this process only); ARGS go to the "
             "script."),
    "generate": ("cs_run.frontends.generate_cli:generate_command", "Continue prompts with a decoder checkpoint "
                 "(greedy or sampled, KV-cached); one JSON line per prompt."),
    "lm-eval": ("cs_run.frontends.lm_eval_cli:lm_eval_command", "Evaluate a decoder checkpoint on "
                "lm-evaluation-harness tasks (needs the 'eval' extra)."),
    "plot": ("cs_run.frontends.plot:plot", "Render the train/eval scalars of MODEL_DIRS as one PNG (needs the 'plot' extra)."),
}
"""Commands owned by other modules, as ``module:attribute`` and the short help ``cs-run --help`` lists
(tests/cli/test_cli.py checks it against the command's own): imported when used, so ``cs-run --help``
and the run commands' help do not import torch."""


class LazyGroup(ErrorGroup):
    """The ``cs-run`` group: its own commands, plus :data:`SUBSYSTEMS` loaded on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *SUBSYSTEMS})

    def get_command(self, ctx: click.Context, name: str) -> Optional[click.Command]:
        if name not in self.commands and name in SUBSYSTEMS:
            module, _, attribute = SUBSYSTEMS[name][0].partition(":")
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return self.commands.get(name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list, with the subsystems' short help from the table (nothing imported)."""
        width = formatter.width - 6 - max(len(name) for name in self.list_commands(ctx))
        rows = [(name, self.commands[name].get_short_help_str(width) if name in self.commands
                 else click.Command(name, help=SUBSYSTEMS[name][1]).get_short_help_str(width))  # click's shortening
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="cs-run")
def cli() -> None:
    """cs-run: train and evaluate cstorch / Model Zoo models on CPU, GPU and the CSX engine.

    \b
    Quick start (bundled fc_mnist on real handwritten digits):
      cs-run train-and-eval --model_dir model_dir/fc_mnist
    Your own model: cs-run init my_model (writes a starter project; see its params.yaml)
    """


def _run(mode: str, options: dict[str, Any], extra_flags: Optional[dict] = None) -> None:
    path: Optional[Path] = options["params_path"] or default_params_path()
    flags = flag_overrides(options)
    flags.update(extra_flags or {})
    overrides = dict(parse_override(text) for text in options["overrides"])
    params = load_params(path, {**overrides, **flags}, given_by=flag_names(options))
    if options.get("print_config"):
        click.echo(params_yaml(params), nl=False)
        return
    setup_console_logging(params.runconfig.logging)
    runner = cs_run.runners.PyTorchBaseRunner.create(params, device=options["device"], mode=mode)
    results = runner.run(mode)
    if not cs_run.replicas.is_master():  # ordinal 0 reports for all replicas
        return
    if "summary" in results:  # compile-only / validate-only: the run's log has the graph summary, once
        return
    for key, value in (results or {}).items():
        if isinstance(value, dict):
            line = ", ".join(f"{k}={v:.5f}" for k, v in value.items())
            click.echo(f"checkpoint step {key}: {line}")
        else:
            click.echo(f"{key} = {value:.5f}")


EXAMPLES = {
    "train": [
        ("the bundled fc_mnist params, 50 steps; the same command with --max_steps 100 resumes at 50",
         "cs-run train --model_dir model_dir/fc_mnist --max_steps 50"),
        ("your params file on the CSX engine, one key overridden",
         "cs-run train --params params.yaml --device CSX --set optimizer.learning_rate=0.02"),
        ("a new run from an earlier checkpoint, into another folder",
         "cs-run train --model_dir model_dir/branch --resume model_dir/fc_mnist/checkpoint_50.mdl --max_steps 70"),
        ("2 replicas, the model sharded over them (FSDP2)",
         "cs-run train --params params.yaml --num_csx 2 --sharding fsdp"),
        ("the resolved params (file, --set and flags applied) as YAML; runs nothing",
         "cs-run train --max_steps 10 --print_config"),
    ],
    "eval": [
        ("the newest checkpoint in model_dir on eval_input",
         "cs-run eval --model_dir model_dir/fc_mnist"),
        ("one checkpoint, 10 eval batches",
         "cs-run eval --model_dir model_dir/fc_mnist --checkpoint_path model_dir/fc_mnist/checkpoint_50.mdl "
         "--eval_steps 10"),
    ],
    "train-and-eval": [
        ("what make run does: 400 steps of fc_mnist from step 0, then eval/loss and eval/accuracy",
         "cs-run train-and-eval --model_dir model_dir/quickstart --resume none"),
        ("a seeded run with another learning rate",
         "cs-run train-and-eval --model_dir model_dir/lr_0.02 --max_steps 40 --seed 2 --set optimizer.learning_rate=0.02"),
        ("evaluate every 100 steps and stop once eval/loss stops improving",
         "cs-run train-and-eval --params params.yaml --set runconfig.eval_frequency=100 "
         "--set runconfig.early_stopping_metric=eval/loss"),
    ],
    "eval-all": [
        ("every checkpoint in model_dir, oldest first",
         "cs-run eval-all --model_dir model_dir/fc_mnist"),
        ("the same on the CSX engine's fx tier",
         "cs-run eval-all --model_dir model_dir/fc_mnist --device CSX --compile_tier fx"),
    ],
    "validate-only": [
        ("trace the training step: its graph summary, or the compliance error at your file:line",
         "cs-run validate-only --params params.yaml"),
        ("trace the eval step instead",
         "cs-run validate-only --params params.yaml --mode eval"),
    ],
    "compile-only": [
        ("compile the training step into the per-user cache, so the next CSX run of it starts at once",
         "cs-run compile-only --params params.yaml --compile_tier inductor"),
        ("a compile cache of its own (a folder the runs that should share it name)",
         "cs-run compile-only --params params.yaml --compile_dir cache/"),
    ],
}
"""Each run command's Examples block (tests/cli/test_help.py parses every one)."""


def _mode_command(name: str, mode: str, summary: str):
    @cli.command(name, cls=RunCommand, help=summary, examples=EXAMPLES[name])
    @run_command_options(name)
    def command(**options: Any) -> None:
        _run(mode, options)

    return command


train = _mode_command("train", "train", "Train, resuming from the newest checkpoint in model_dir (see --resume).")
evaluate = _mode_command("eval", "eval", "Evaluate the newest (or --checkpoint_path) checkpoint on eval_input.")
train_and_eval = _mode_command("train-and-eval", "train_and_eval", "Train, then evaluate the final weights.")
eval_all = _mode_command("eval-all", "eval_all", "Evaluate every checkpoint in model_dir, oldest first.")


def _trace_only_command(name: str, key: str, summary: str):
    @cli.command(name, cls=RunCommand, help=summary, examples=EXAMPLES[name])
    @click.option("--mode", type=click.Choice(["train", "eval"]), default="train", show_default=True,
                  help="Which step to trace.")
    @run_command_options(name)
    def command(mode: str, **options: Any) -> None:
        if options["device"].upper() != "CSX":
            options["device"] = "CSX"  # the CSX engine is what these commands check
        _run(mode, options, {f"runconfig.{key}": True})

    return command


validate_only = _trace_only_command(
    "validate-only", "validate_only",
    "Trace the step on CSX: report its graph, or the compliance error with file:line. Runs nothing.")
compile_only = _trace_only_command(
    "compile-only", "compile_only",
    "Trace and compile the step into the compile cache, so the next CSX run starts at once. Runs nothing.")


STARTERS = {"custom_model": ("params.yaml", "model.py", "data.py"), "fc_mnist": ("params.yaml",),
            "gpt2": ("params.yaml",)}
"""What ``cs-run init`` copies out of each bundled example (fc_mnist's and gpt2's models are built in)."""

STARTER_DATA = {"gpt2": ("../../model_dir/gpt2_data/", "gpt2_data",
                         "cs-run data preprocess --stdlib -o {data} --max_seq_length 128 --vocab_size 4096 "
                         "--eval_fraction 0.05")}
"""Examples whose data is prepared first: (the bundled params' data_dir prefix, where ``make run-gpt2``
writes the shards in a clone; the starter's data folder, relative to its own folder; the command that
writes the shards there). The prefix is checked, so a change of the bundled file cannot go unnoticed."""


@cli.command("init", cls=HelpCommand, examples=[
    ("a small CNN project to make your own, then train it",
     "cs-run init my_model && cs-run train --params my_model/params.yaml --max_steps 100"),
    ("the bundled GPT-2 example's params file", "cs-run init my_gpt2 --example gpt2")])
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--example", type=click.Choice(sorted(STARTERS)), default="custom_model", show_default=True,
              help="custom_model: params.yaml, model.py and data.py of a small CNN to make your own; fc_mnist, "
                   "gpt2: the bundled example's params.yaml.")
@click.option("--force", is_flag=True, cls=Flag, default_text="off", help="Overwrite files of the same names in FOLDER.")
def init(folder: Path, example: str, force: bool) -> None:
    """Write a starter project into FOLDER (created if needed): a params file, and for custom_model the
    model and data functions it names. Then: cs-run train --params FOLDER/params.yaml"""
    source = resources.files("cs_run.examples") / example
    targets = [folder / name for name in STARTERS[example]]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not force:
        raise click.UsageError(f"{', '.join(existing)} already exist(s); choose another folder or add --force "
                               "to overwrite")
    if folder.exists() and not folder.is_dir():
        raise click.UsageError(f"{folder} is a file; choose a folder")
    contents = {target: (source / target.name).read_bytes() for target in targets}
    data = STARTER_DATA.get(example)
    if data is not None:  # point data_dir into the new folder, where the printed command writes the shards
        params = folder / "params.yaml"
        bundled, starter, _ = data
        if f'"{bundled}'.encode() not in contents[params]:
            raise click.ClickException(f"cs-run's bundled {example} params no longer hold {bundled}; please report it")
        contents[params] = contents[params].replace(f'"{bundled}'.encode(), f'"{starter}/'.encode())
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for target, content in contents.items():
            target.write_bytes(content)
    except OSError as e:  # a file on the way or no permission (the folder given is wrong: exit 2), a full disk
        wrong = e.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS)
        raise (ParamsError if wrong else CsRunError)(f"init: cannot write the starter into {folder}: "
                                                     f"{e.strerror or e} ({e.filename}); choose another folder") from None
    click.echo(f"Wrote {', '.join(str(t) for t in targets)}")
    if data is not None:
        click.echo(f"Next: {data[2].format(data=folder / data[1])}")
        click.echo(f"Then: cs-run train --params {folder / 'params.yaml'}")
    else:
        click.echo(f"Next: cs-run train --params {folder / 'params.yaml'}")


def main(argv: Optional[list[str]] = None) -> None:
    """Console entry point of ``cs-run``."""
    cli.main(args=argv, prog_name="cs-run")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
