"""The ``cs-run`` command line: parses, builds params, hands over to a runner. No training logic here.

Exit codes: 0 success, 2 usage or params error (the input is wrong), 1 a run that failed; every
failure is reported by :mod:`cs_run.exits`.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import Any, Optional

import click

from cs_run import replicas
from cs_run._logging import setup_console_logging
from cs_run.checkpoint.cli import checkpoint
from cs_run.compat.cli import exec_command
from cs_run.examples.gpt2.cli import data
from cs_run.exits import ErrorGroup
from cs_run.options import RunOption, flag_overrides, run_options
from cs_run.params import load_params, parse_override
from cs_run.plot import plot
from cs_run.runners import PyTorchBaseRunner

__all__ = ["cli", "main"]

def default_params_path() -> Path:
    """The bundled fc_mnist params: what ``cs-run train`` runs when no --params is given."""
    return Path(str(resources.files("cs_run.examples") / "fc_mnist" / "params.yaml"))


def _click_option(option: RunOption):
    """A RunConfig flag as a click option (type, range, choices and help from the field)."""
    if option.kind == "int":
        kind: Any = click.IntRange(min=option.minimum)
    elif option.kind == "choice":
        kind = click.Choice(option.choices, case_sensitive=False)
    elif option.path == "dir":
        kind = click.Path(file_okay=False, path_type=Path)
    elif option.path == "file":
        kind = click.Path(dir_okay=False, path_type=Path)
    else:
        kind = str
    names = [f"--{option.name}"] + ([option.short] if option.short else [])
    return click.option(*names, type=kind, multiple=option.kind == "list", metavar=option.metavar,
                        help=option.help + (" (repeatable)" if option.kind == "list" else ""))


# The Model Zoo run-script flags: the params file and device, every flag-marked RunConfig field (one
# declaration, see cs_run.options), and --set for any other key.
_RUN_OPTIONS = [
    click.option("--params", "-p", "params_path", type=click.Path(dir_okay=False, path_type=Path),
                 help="Params YAML (Model Zoo layout). Default: the bundled fc_mnist params."),
    click.option("--device", type=click.Choice(["CPU", "GPU", "CSX"], case_sensitive=False), default="CPU",
                 show_default=True, help="Eager CPU or GPU, or CSX: the traced, compiled engine (on CUDA if present)."),
    *[_click_option(option) for option in run_options() if option.cli],
    click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                 help="Override any params key, e.g. --set runconfig.log_steps=10; KEY=null removes it (repeatable). "
                      "Precedence: params file < --set < a flag."),
]


def modelzoo_options(fn):
    """The Model Zoo run-script flags, declared on each subcommand (they come after it)."""
    for option in reversed(_RUN_OPTIONS):
        fn = option(fn)
    return fn


@click.group(cls=ErrorGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="cs-run")
def cli() -> None:
    """cs-run: train and evaluate cstorch / Model Zoo models on CPU, GPU and the CSX engine.

    \b
    Quick start (bundled fc_mnist on real handwritten digits):
      cs-run train-and-eval --model_dir model_dir/fc_mnist
    """


def _run(mode: str, options: dict[str, Any], extra_flags: Optional[dict] = None) -> None:
    path: Optional[Path] = options["params_path"] or default_params_path()
    flags = flag_overrides(options)
    flags.update(extra_flags or {})
    overrides = dict(parse_override(text) for text in options["overrides"])
    params = load_params(path, {**overrides, **flags})
    setup_console_logging(params.runconfig.logging)
    runner = PyTorchBaseRunner.create(params, device=options["device"], mode=mode)
    results = runner.run(mode)
    if not replicas.is_master():  # ordinal 0 reports for all replicas
        return
    if "summary" in results:  # compile-only / validate-only
        click.echo(results["summary"])
        return
    for key, value in (results or {}).items():
        if isinstance(value, dict):
            line = ", ".join(f"{k}={v:.5f}" for k, v in value.items())
            click.echo(f"checkpoint step {key}: {line}")
        else:
            click.echo(f"{key} = {value:.5f}")


def _mode_command(name: str, mode: str, summary: str):
    @cli.command(name, help=summary)
    @modelzoo_options
    def command(**options: Any) -> None:
        _run(mode, options)

    return command


train = _mode_command("train", "train", "Train, resuming from the newest checkpoint in model_dir.")
evaluate = _mode_command("eval", "eval", "Evaluate the newest (or --checkpoint_path) checkpoint on eval_input.")
train_and_eval = _mode_command("train-and-eval", "train_and_eval", "Train, then evaluate the final weights.")
eval_all = _mode_command("eval-all", "eval_all", "Evaluate every checkpoint in model_dir, oldest first.")


def _trace_only_command(name: str, key: str, summary: str):
    @cli.command(name, help=summary)
    @click.option("--mode", type=click.Choice(["train", "eval"]), default="train", show_default=True,
                  help="Which step to trace.")
    @modelzoo_options
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


def _attach_subsystems() -> None:
    """Commands owned by other modules: ``cs-run checkpoint convert|info``, ``cs-run data preprocess``,
    ``cs-run plot``, ``cs-run exec``."""
    cli.add_command(checkpoint)
    cli.add_command(data)
    cli.add_command(plot)
    cli.add_command(exec_command)


_attach_subsystems()


def main(argv: Optional[list[str]] = None) -> None:
    """Console entry point of ``cs-run``."""
    cli.main(args=argv, prog_name="cs-run")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
