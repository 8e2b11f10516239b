"""``cs-run exec script.py [args]``: run a vendor script unchanged (see :mod:`cs_run.frontends.compat`)."""

from __future__ import annotations

import click

from cs_run.frontends.compat import run_script

__all__ = ["exec_command"]


@click.command("exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                         "help_option_names": []})
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def exec_command(script: str, args: tuple[str, ...]) -> None:
    """Run a vendor script with cerebras.pytorch, cerebras_pytorch, modelzoo.common.pytorch and
    cerebras.modelzoo resolved to cs-run (this process only); ARGS go to the script.

    \b
    Example: cs-run exec run.py CPU --mode train --params configs/params.yaml
    (ARGS after SCRIPT, --help included, are the script's own.)"""
    if script in ("-h", "--help"):  # the command's own help: every other flag belongs to the script
        click.echo(click.get_current_context().get_help())
        return
    run_script(script, list(args))
