"""One mapping from an exception to what the user sees and the exit code, for every entry point.

``cs-run`` (and its ``checkpoint`` group) and the Model Zoo ``run()`` all end here:

======================================  ===========================================================  ====
exception                               shown                                                        exit
======================================  ===========================================================  ====
CsRunError (bad input, failed run)      ``Error: <message>``                                          its
click usage error (unknown flag, ...)   ``Error: <message> (see 'cs-run CMD --help')``, no Usage block  2
an error raised in the user's code      the traceback's frames in the user's files, then one
                                        ``Error: <Type>: <message> (raised at file:line)`` line         1
a first Ctrl-C / SIGTERM in training   nothing more (the run logged "interrupted at step N; ...")    130/143
a second one, or one outside training   ``Error: aborted ...`` / ``Error: interrupted``               130/143
a SyntaxError in the user's files        the same, the offending line shown as Python shows it           1
any other exception (a cs-run bug)      the whole traceback, then the ``Error:`` line                   1
======================================  ===========================================================  ====

With ``CS_RUN_DEBUG=1`` in the environment every error shows Python's whole traceback (chained causes
included) before its ``Error:`` line: what a user module that failed to import raised, for instance.

In a replica of several (:mod:`cs_run.replicas`) the ``Error:`` line is also recorded for the launcher;
a replica that cs-run launched leaves printing it to the launcher, so the job prints one line.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Any, NoReturn, Optional

import click

from cs_run._frames import is_user_file, user_frames
from cs_run.errors import CsRunError
from cs_run.interrupts import Interrupted

OPTIONAL_PACKAGES = {
    "sklearn": ("scikit-learn", "examples"),
    "tokenizers": ("tokenizers", "examples"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "safetensors": ("safetensors", "safetensors"),
    "transformers": ("transformers", "hf"),
    "matplotlib": ("matplotlib", "plot"),
    "hdf5plugin": ("hdf5plugin", "vendor"),
    "zlib_ng": ("zlib-ng", "fast-crc"),
    "lm_eval": ("lm-eval", "eval"),
    "PIL": ("pillow", "vision"),
    "torchvision": ("torchvision", "vision"),
}
"""Optional import name -> (pip package, the setup.cfg extra that installs it), for the one-line error
of a missing one (tests/test_packaging.py checks it against setup.cfg)."""


DEBUG_ENV = "CS_RUN_DEBUG"
"""Set (non-empty) in the environment: every error shows Python's whole traceback before its ``Error:`` line."""


def _replicas() -> Any:
    """cs_run.replicas when this process loaded it, else None. A replica always has (it joins and reduces
    through it), and a usage error fails in the launching process before any replica starts, so an error
    never needs torch.distributed imported just to be reported (``cs-run --help`` stays fast)."""
    return sys.modules.get("cs_run.replicas")


__all__ = ["DEBUG_ENV", "error_text", "exit_code", "report", "ErrorGroup", "ArgumentParser"]


def exit_code(exc: BaseException) -> int:
    """2 when the user's input is wrong (params, usage), 1 when a run failed."""
    if isinstance(exc, CsRunError):
        return exc.exit_code
    if isinstance(exc, click.ClickException):
        return exc.exit_code
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return getattr(exc, "exit_code", 130)  # the shell's 128 + signal: 130 SIGINT, 143 SIGTERM
    return 1


def _one_line(text: str) -> str:
    return "; ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())


def _own_message(exc: CsRunError) -> str:
    """The message of a CsRunError; one raised in a torch DataLoader worker comes back as the same type
    whose message is "Caught X in DataLoader worker process N." plus the worker's traceback: its last
    line is the original message."""
    text = str(exc)
    caught = f"Caught {type(exc).__name__} in "
    if not (text.startswith(caught) and "\nOriginal Traceback" in text):
        return text
    where = text.split(".\n", 1)[0].removeprefix(caught)
    last = text.rstrip().splitlines()[-1]
    return f"{last.removeprefix(f'{type(exc).__module__}.{type(exc).__qualname__}: ')} (in {where})"


def error_text(exc: BaseException) -> str:
    """What :func:`report` shows for ``exc`` (also what a run writes into model_dir/run.log); empty for an
    :class:`~cs_run.interrupts.Interrupted` run, which logged its own line."""
    if isinstance(exc, Interrupted):
        return ""
    replicas = _replicas()
    if replicas is not None and replicas.lost_peer(exc):  # another replica's failure (or silence), not a bug
        return (f"Error: replica {replicas.ordinal()} of {replicas.world_size()} lost its peers in a collective "
                f"({_one_line(exc)}); another replica failed or did not answer within runconfig.collective_timeout")
    if isinstance(exc, CsRunError):
        return f"Error: {_one_line(_own_message(exc))}"
    if isinstance(exc, click.UsageError):
        command = exc.ctx.command_path if exc.ctx is not None else "cs-run"
        return f"Error: {_one_line(exc.format_message())} (see '{command} --help')"
    if isinstance(exc, click.ClickException):
        return f"Error: {_one_line(exc.format_message())}"
    if isinstance(exc, click.exceptions.Abort):
        return "Error: aborted"
    if isinstance(exc, KeyboardInterrupt):  # Aborted (a second signal), or a Ctrl-C outside a training loop
        return f"Error: {_one_line(exc)}" if str(exc) else "Error: interrupted"
    missing = (exc.name or "").partition(".")[0] if isinstance(exc, ModuleNotFoundError) else ""
    if missing in OPTIONAL_PACKAGES:
        package, extra = OPTIONAL_PACKAGES[missing]
        return f"Error: {package} is not installed; install the '{extra}' extra: pip install 'cs-run[{extra}]'"
    summary = f"{type(exc).__name__}: {_one_line(exc)}" if str(exc) else type(exc).__name__
    frames = user_frames(exc)
    if isinstance(exc, SyntaxError) and exc.filename and is_user_file(exc.filename):  # raised by the compiler
        return "\n".join(["Traceback (most recent call last; your code's frames only):",
                          ("".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(exc)))
                          .rstrip("\n"),
                          f"Error: {type(exc).__name__}: {exc.msg} (in your code at {exc.filename}:{exc.lineno})"])
    if frames:
        return "\n".join(["Traceback (most recent call last; your code's frames only):",
                          "".join(traceback.format_list(frames)).rstrip("\n"),
                          f"Error: {summary} (raised in your code at {frames[-1].filename}:{frames[-1].lineno})"])
    return "\n".join(["".join(traceback.format_exception(exc)).rstrip("\n"),
                      f"Error: {summary} (an internal error of cs-run; please report it with the traceback above)"])


def report(exc: BaseException, file: Any = None) -> int:
    """Print ``exc`` the one way every entry point does; returns its exit code."""
    text = error_text(exc)
    if text and os.environ.get(DEBUG_ENV) and not text.startswith("Traceback (most recent call last):"):
        text = "\n".join(["".join(traceback.format_exception(exc)).rstrip("\n"), text.split("\n")[-1]])
    lines = text.split("\n")
    replicas = _replicas()
    if replicas is not None and replicas.in_replica_env() and lines[-1].startswith("Error: "):  # the last line is the Error: line
        replicas.record_failure(lines[-1].removeprefix("Error: "), exit_code(exc), replicas.lost_peer(exc))
        if replicas.reports_to_launcher():  # the launcher prints the job's one line
            text = "\n".join(lines[:-1])
    if text:
        click.echo(text, err=file is None, file=file)
    return exit_code(exc)


class _Interrupt(BaseException):
    """Carries a Ctrl-C past click, which would print an empty line and turn it into ``Abort``."""


class ErrorGroup(click.Group):
    """A click group whose every failure goes through :func:`report` (one line for usage errors too)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as e:
            raise _Interrupt(e) from None

    def main(self, args: Optional[list[str]] = None, prog_name: Optional[str] = None,
             complete_var: Optional[str] = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except SystemExit:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure is reported the one way
            if isinstance(exc, _Interrupt):
                exc = exc.args[0]  # the interrupt knows its step and signal
            _exit(report(exc))
        code = result if isinstance(result, int) else 0
        replicas = _replicas()
        if code == 0 and replicas is not None and replicas.in_replica_env():
            replicas.record_finished()
        _exit(code)


def _exit(code: int) -> NoReturn:
    """Exit with ``code``; a replica (torchrun's or the launcher's) ends its process without the interpreter's
    finalization (:func:`cs_run.replicas.end_process`: its process groups' threads outlive it). A process
    that only has a group of its own (``join_alone``, e.g. a test running commands in-process) exits as usual."""
    replicas = _replicas()
    if replicas is not None and replicas.in_replica_env() and replicas.joined():
        replicas.end_process(code)
    sys.exit(code)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the same one-line usage error as ``cs-run`` (exit 2, no usage block)."""

    def error(self, message: str) -> NoReturn:
        click.echo(f"Error: {_one_line(message)} (see '{self.prog} --help')", err=True)
        sys.exit(2)
