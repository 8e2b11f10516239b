"""``cs-run plot``: render the scalars of one or more runs (``model_dir/train``, ``model_dir/eval``) as a PNG.

Reads the CSVs :class:`cs_run.summaries.ScalarWriter` writes, so no TensorBoard is needed;
matplotlib is the optional ``plot`` extra and is imported only here, only when plotting.

One model_dir can hold several invocations: a resume (steps continue), a restart from an earlier
checkpoint (a branch: steps go back or repeat), eval runs. Drawn as one line they zig-zag, so the rows
are cut into *segments* (:func:`split_segments`): a new segment starts where a tag's step goes back
or repeats; an invocation that continues forward stays in its segment with a dotted mark where it
resumed. Each eval row goes to the segment its invocation trained (else to the newest segment started
before it) and repeated evals of one step keep the last. A segment has one colour in every panel:
train is its solid line, eval its dashed line with markers.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from cs_run.errors import CsRunError, ParamsError
from cs_run.frontends.help_format import Flag, HelpCommand
from cs_run.summaries import ScalarRow, read_scalar_rows

__all__ = ["Segment", "attach_evals", "load_segments", "make_figure", "plot", "plot_scalars",
           "split_segments"]

logger = logging.getLogger(__name__)


@dataclass
class Segment:
    """A stretch of one model_dir's training whose steps only go forward, and the evals of it."""

    number: int
    """1-based, in the order the segments were written."""
    start_time: float
    """Wall time of its first row."""
    runs: list[str] = field(default_factory=list)
    """Run ids (:data:`cs_run.summaries.RUN_ID`) of the invocations that wrote it."""
    train: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    eval: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    resumed_at: list[int] = field(default_factory=list)
    """Last step before each later invocation that continued this segment."""

    def steps(self) -> tuple[int, int]:
        """(first, last) step of its train rows, else of its evals."""
        series = self.train or self.eval
        found = [s for points in series.values() for s, _ in points]
        return (min(found), max(found)) if found else (0, 0)


def split_segments(rows: list[ScalarRow]) -> list[Segment]:
    """The train rows of one model_dir (file order) cut where steps go back or repeat.

    A new segment starts at a row whose step is not past its tag's previous step, or at the first row
    of another invocation (``run``) that does not start past every step so far; another invocation
    that starts past them continues the segment and is recorded in ``resumed_at``.
    """
    segments: list[Segment] = []
    cur: Segment | None = None
    last: dict[str, int] = {}
    top = -math.inf
    run = None
    for row in rows:
        new_run = cur is not None and row.run != run
        if cur is None or row.step <= last.get(row.tag, -math.inf) or (new_run and row.step <= top):
            cur = Segment(number=len(segments) + 1, start_time=row.wall_time, runs=[row.run])
            segments.append(cur)
            last, top = {}, -math.inf
        elif new_run:
            cur.resumed_at.append(int(top))
            cur.runs.append(row.run)
        run = row.run
        cur.train.setdefault(row.tag, []).append((row.step, row.value))
        last[row.tag] = row.step
        top = max(top, row.step)
    return segments


def _owner(segments: list[Segment], row: ScalarRow) -> Segment:
    started = [s for s in segments if not s.start_time > row.wall_time]  # NaN times (old files) count as started
    same_run = [s for s in segments if row.run and row.run in s.runs]
    if same_run:  # trained by the invocation that evaluated (an eval may come before its first train row)
        return ([s for s in same_run if s in started] or same_run)[-1]
    return (started or segments)[-1]  # an eval run: the newest training before it


def attach_evals(segments: list[Segment], rows: list[ScalarRow]) -> list[Segment]:
    """Adds the eval rows to the segments they belong to (an eval-only model_dir gets one segment);
    repeated evals of one step in one segment keep the last value. Returns ``segments``."""
    if not rows:
        return segments
    if not segments:
        segments.append(Segment(number=1, start_time=rows[0].wall_time, runs=[rows[0].run]))
    found: dict[int, dict[str, dict[int, float]]] = {}
    for row in rows:
        seg = _owner(segments, row)
        found.setdefault(seg.number, {}).setdefault(row.tag, {})[row.step] = row.value
    for seg in segments:
        seg.eval = {tag: sorted(points.items()) for tag, points in found.get(seg.number, {}).items()}
    return segments


def load_segments(model_dir: str | os.PathLike) -> list[Segment]:
    """The segments of ``model_dir`` (train and eval scalars); empty when it has none."""
    model_dir = Path(model_dir)
    return attach_evals(split_segments(read_scalar_rows(model_dir / "train")), read_scalar_rows(model_dir / "eval"))


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


def _dir_labels(model_dirs: list[Path]) -> list[str]:
    """Legend prefixes: none for one run; folder names, or the paths where names repeat."""
    if len(model_dirs) == 1:
        return [""]
    names = [d.name or str(d) for d in model_dirs]
    return names if len(set(names)) == len(names) else [str(d) for d in model_dirs]


def _segment_label(seg: Segment, many: bool) -> str:
    if not many:
        return ""
    return f"#{seg.number} ({_span(seg)})"


def _span(seg: Segment) -> str:
    first, last = seg.steps()
    return f"step {first}" if first == last else f"steps {first}-{last}"


def make_figure(model_dirs: list[Path], tags: list[str] | None = None, logy: bool = False) -> Any:
    """A matplotlib figure: one panel per tag, one colour per segment of each run, train solid, eval
    dashed with markers, dotted verticals where a run was resumed. Line labels are
    ``[<run>] [#<segment> (steps <first>-<last>)] <split>`` (``(step <n>)`` for a one-step segment).

    Raises:
        CsRunError: a model_dir has no scalars, or matplotlib is not installed.
        ParamsError: a requested tag is in none of the runs.
    """
    runs = []
    for d in model_dirs:
        segments = load_segments(d)
        if not segments:
            raise CsRunError(
                f"no scalars found in {d}: expected {d / 'train' / 'scalars.csv'} or "
                f"{d / 'eval' / 'scalars.csv'} (written by a cs-run train/eval run)"
            )
        runs.append(segments)
    found = list(dict.fromkeys(t for segs in runs for s in segs for split in (s.train, s.eval) for t in split))
    if tags:
        missing = [t for t in tags if t not in found]
        if missing:
            where = ", ".join(str(d) for d in model_dirs)
            raise ParamsError(f"--tags: {', '.join(missing)} not found in {where}; available: {', '.join(found)}")
        found = list(tags)
    plt = _import_pyplot()
    cols = min(3, len(found))
    rows = math.ceil(len(found) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, tag in zip(axes.flat, found):
        values: list[float] = []
        k = 0
        for prefix, segments in zip(_dir_labels(model_dirs), runs):
            for seg in segments:
                colour = colours[k % len(colours)]
                k += 1
                name = " ".join(p for p in (prefix, _segment_label(seg, len(segments) > 1)) if p)
                drawn = False
                for split, series in (("train", seg.train), ("eval", seg.eval)):
                    if tag not in series:
                        continue
                    steps, ys = zip(*series[tag])
                    values += ys
                    style = {"linestyle": "-", "marker": "." if len(steps) < 20 else None}
                    if split == "eval":
                        style = {"linestyle": "--", "marker": "o", "markersize": 5, "markerfacecolor": "none"}
                    ax.plot(steps, ys, color=colour, label=f"{name} {split}".strip(), **style)
                    drawn = True
                for step in seg.resumed_at if drawn else ():
                    ax.axvline(step, color=colour, linestyle=":", alpha=0.7, label=f"{name} resumed".strip())
        ax.set_title(tag)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if logy:
            if values and min(values) > 0:
                ax.set_yscale("log")
            else:
                logger.warning("--logy: %s has values <= 0; its panel stays linear", tag)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))  # one entry per label (a segment resumed twice)
        ax.legend(unique.values(), unique.keys(), fontsize="small")
    for ax in list(axes.flat)[len(found) :]:
        ax.set_visible(False)
    fig.suptitle(", ".join(str(d) for d in model_dirs))
    fig.tight_layout()
    return fig


def plot_scalars(
    run_dirs: str | os.PathLike | list[str | os.PathLike],
    output_png: str | os.PathLike,
    tags: list[str] | None = None,
    logy: bool = False,
) -> Path:
    """Draws :func:`make_figure` of one model_dir (or several, overlaid) into a PNG.

    Args:
        run_dirs: The model_dir of a run (with ``train/`` and/or ``eval/`` scalar CSVs), or a list.
        output_png: Where to write the image.
        tags: Tags to draw, in this order; None draws every tag found.
        logy: Logarithmic y axes (panels with a value <= 0 stay linear).

    Returns:
        The path of the PNG.
    """
    dirs = [Path(d) for d in (run_dirs if isinstance(run_dirs, (list, tuple)) else [run_dirs])]
    fig = make_figure(dirs, tags, logy)
    plt = _import_pyplot()
    output_png = Path(output_png)
    output_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output_png, dpi=100)
    plt.close(fig)
    logger.info("Wrote %d panel(s) of %s to %s", len(fig.axes), ", ".join(map(str, dirs)), output_png)
    return output_png


@click.command("plot", cls=HelpCommand, examples=[
    ("loss, lr and eval curves of one run", "cs-run plot model_dir/fc_mnist -o curves.png"),
    ("two runs overlaid, logarithmic y", "cs-run plot model_dir/fc_mnist model_dir/csx --logy -o cpu_vs_csx.png"),
    ("only some tags", "cs-run plot model_dir/fc_mnist --tags loss,lr")])
@click.argument(
    "model_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    cls=Flag,
    default_text="MODEL_DIR/scalars.png; scalars.png here for several MODEL_DIRS",
    help="PNG to write.",
)
@click.option(
    "--tags",
    default=None,
    cls=Flag,
    default_text="all",
    help="Comma-separated tags to draw, e.g. loss,lr.",
)
@click.option("--logy", is_flag=True, cls=Flag, default_text="off", help="Logarithmic y axes (panels with values <= 0 stay linear).")
def plot(model_dirs: tuple[Path, ...], output: Path | None, tags: str | None, logy: bool) -> None:
    """Render the train/eval scalars of MODEL_DIRS as one PNG (needs the 'plot' extra).

    A restart from an earlier checkpoint starts a new segment (its own colour, labelled #N); several
    MODEL_DIRS are overlaid (e.g. a CPU and a CSX run) with a legend.
    """
    tag_list = [t.strip() for t in tags.split(",") if t.strip()] if tags else None
    default = model_dirs[0] / "scalars.png" if len(model_dirs) == 1 else Path("scalars.png")
    path = plot_scalars(list(model_dirs), output or default, tag_list, logy)
    for d in model_dirs:
        segments = load_segments(d)
        if len(segments) > 1:
            spans = ", ".join(f"#{s.number} {_span(s)}" for s in segments)
            click.echo(f"{d}: {len(segments)} segments (restarted from an earlier step): {spans}")
    click.echo(str(path))
