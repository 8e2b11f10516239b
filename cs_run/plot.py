"""``cs-run plot``: render the scalars of a run (``model_dir/train``, ``model_dir/eval``) as a PNG.

Reads the CSVs :class:`cs_run.summaries.ScalarWriter` writes, so no TensorBoard is needed;
matplotlib is the optional ``plot`` extra and is imported only here, only when plotting.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import click

from cs_run.errors import CsRunError, ParamsError
from cs_run.summaries import read_scalars

__all__ = ["SPLITS", "load_run_scalars", "plot", "plot_scalars"]

logger = logging.getLogger(__name__)

SPLITS = ("train", "eval")


def load_run_scalars(
    run_dir: str | os.PathLike,
) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{split: {tag: [(step, value), ...]}}`` for the splits of ``run_dir`` that have scalars."""
    run_dir = Path(run_dir)
    return {split: s for split in SPLITS if (s := read_scalars(run_dir / split))}


def _import_pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never needs a display
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise CsRunError(
            "plotting needs matplotlib: pip install 'cs-run[plot]'"
        ) from err
    return plt


def plot_scalars(
    run_dir: str | os.PathLike,
    output_png: str | os.PathLike,
    tags: list[str] | None = None,
) -> Path:
    """Draws one subplot per tag (train and eval curves of the same tag share it) into a PNG.

    Args:
        run_dir: The model_dir of a run (with ``train/`` and/or ``eval/`` scalar CSVs).
        output_png: Where to write the image.
        tags: Tags to draw, in this order; None draws every tag found.

    Returns:
        The path of the PNG.

    Raises:
        CsRunError: No scalars under ``run_dir``, a requested tag is missing, or matplotlib is
            not installed.
    """
    run_dir = Path(run_dir)
    scalars = load_run_scalars(run_dir)
    if not scalars:
        raise CsRunError(
            f"no scalars found in {run_dir}: expected {run_dir / 'train' / 'scalars.csv'} or "
            f"{run_dir / 'eval' / 'scalars.csv'} (written by a cs-run train/eval run)"
        )
    found = list(dict.fromkeys(tag for split in scalars.values() for tag in split))
    if tags:
        missing = [t for t in tags if t not in found]
        if missing:
            raise ParamsError(
                f"tags {missing} not found in {run_dir}; available: {', '.join(found)}"
            )
        found = list(tags)
    plt = _import_pyplot()
    cols = min(3, len(found))
    rows = math.ceil(len(found) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    for ax, tag in zip(axes.flat, found):
        for split, series in scalars.items():
            if tag in series:
                steps, values = zip(*series[tag])
                ax.plot(
                    steps, values, marker="o" if len(steps) < 20 else None, label=split
                )
        ax.set_title(tag)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(found) :]:
        ax.set_visible(False)
    fig.suptitle(str(run_dir))
    fig.tight_layout()
    output_png = Path(output_png)
    output_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output_png, dpi=100)
    plt.close(fig)
    logger.info("Wrote %d plot(s) of %s to %s", len(found), run_dir, output_png)
    return output_png


@click.command("plot")
@click.argument(
    "model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="PNG to write (default: MODEL_DIR/scalars.png).",
)
@click.option(
    "--tags",
    default=None,
    help="Comma-separated tags to draw (default: all), e.g. loss,lr.",
)
def plot(model_dir: Path, output: Path | None, tags: str | None) -> None:
    """Render the train/eval scalars of MODEL_DIR as a PNG (needs the 'plot' extra)."""
    tag_list = [t.strip() for t in tags.split(",") if t.strip()] if tags else None
    path = plot_scalars(model_dir, output or model_dir / "scalars.png", tag_list)
    click.echo(str(path))
