"""How every ``cs-run`` command's ``--help`` reads, and the two spellings of its flags.

A command of :class:`HelpCommand` shows every option's default (or where the value comes from when the
option is not given: ``from runconfig.max_steps``), its options in titled sections (click has no option
groups: :meth:`HelpCommand.format_options` renders them) and an Examples block, as LightningCLI and
accelerate users expect. Every multi-word flag takes ``--a_b`` and ``--a-b`` alike: click's parser
normalizes the option names it reads (``token_normalize_func``) to the underscore spelling, which is the
one declared and shown (the Model Zoo's run scripts spell their flags so); option values (``--set
model.name=gpt-neox``) and the arguments of other commands are left as typed.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import click

__all__ = ["OPTIONS", "Flag", "HelpCommand", "normalize_flag"]

OPTIONS = "Options"
"""The section of an option that names no other; it comes first."""


def normalize_flag(name: str) -> str:
    """The declared spelling of a flag name as typed (``max-steps`` -> ``max_steps``).

    click calls it on option names (and on the values of a ``click.Choice``, none of which holds ``-``
    or ``_``), never on other values; ``--set`` keys and paths keep their spelling."""
    return name.replace("-", "_")


class Flag(click.Option):
    """A click option that knows its help section and, where click shows no default, what it is.

    Args:
        section: the help section it is listed under (:data:`OPTIONS` if not given).
        default_text: shown as ``[default: ...]``: where the value comes from when the flag is not given
            (``from runconfig.max_steps (unset: no cap)``), or ``off`` for a switch.
    """

    def __init__(self, *args: Any, section: str = OPTIONS, default_text: Optional[str] = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.section = section
        self.default_text = default_text

    def get_help_record(self, ctx: click.Context) -> Optional[tuple[str, str]]:
        record = super().get_help_record(ctx)
        if record is None or self.default_text is None:
            return record
        spec, text = record
        extra = f"default: {self.default_text}"
        if text.endswith("]") and "  [" in text:  # click's own extras ([x>=1], [required]) join the one bracket
            head, _, tail = text.rpartition("  [")
            return spec, f"{head}  [{extra}; {tail}"
        return spec, f"{text}  [{extra}]" if text else f"[{extra}]"


class HelpCommand(click.Command):
    """A command whose help lists its options by section and ends with its examples, and whose flags
    take both spellings (:func:`normalize_flag`).

    Args:
        examples: ``(what it does, command line)`` pairs, shown under "Examples:" in this order (an empty
            "what it does": the line continues the example above).
        section_notes: a line shown under a section's title (what the whole section has in common).
    """

    def __init__(self, *args: Any, examples: Sequence[tuple[str, str]] = (),
                 section_notes: Optional[dict[str, str]] = None, **kwargs: Any):
        settings = dict(kwargs.pop("context_settings", None) or {})
        settings.setdefault("token_normalize_func", normalize_flag)
        super().__init__(*args, context_settings=settings, **kwargs)
        self.examples = tuple(examples)
        self.section_notes = dict(section_notes or {})

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The options under their sections' titles: Options first, then the others in order of appearance."""
        sections: dict[str, list[tuple[str, str]]] = {OPTIONS: []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None  # arguments: the usage line
            if record is not None:
                sections.setdefault(getattr(param, "section", OPTIONS), []).append(record)
        for title, rows in sections.items():
            if not rows:
                continue
            with formatter.section(title):
                if title in self.section_notes:
                    formatter.write_text(self.section_notes[title])
                formatter.write_dl(rows)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The examples, each a comment line and the command as it is typed (never re-wrapped)."""
        if self.examples:
            with formatter.section("Examples"):
                for what, line in self.examples:
                    if what:  # an empty one: the line continues the example above
                        formatter.write(f"{'':>{formatter.current_indent}}# {what}\n")
                    formatter.write(f"{'':>{formatter.current_indent}}{line}\n")
        super().format_epilog(ctx, formatter)
