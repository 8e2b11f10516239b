"""`cs-run plot`: segments of restarted runs, deduplicated evals, one colour per segment, --logy, overlays.

The figure is checked on its data (each line's label, x, y, colour), not on pixels; the expected
segments come from the CSV rows themselves (read with the csv module) or from the values written.
"""

from __future__ import annotations

import builtins
import csv

import pytest
from click.testing import CliRunner

from cs_run.errors import CsRunError, ParamsError
from cs_run.frontends.cli import cli
from cs_run.frontends.plot import load_segments, make_figure, plot, plot_scalars
from cs_run.summaries import ScalarWriter

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write(folder, run_id, rows, monkeypatch, t0=0.0):
    """Rows ``(step, {tag: value})`` written by one invocation ``run_id`` (its wall times from t0)."""
    monkeypatch.setattr("cs_run.summaries.RUN_ID", run_id)
    with ScalarWriter(folder, tensorboard=False) as w:
        for i, (step, scalars) in enumerate(rows):
            for tag, value in scalars.items():
                w.add_scalar(tag, value, step, wall_time=t0 + i)


def lines_of(fig, title):
    """{label: (xs, ys, colour, linestyle)} of the panel titled ``title``."""
    ax = next(a for a in fig.axes if a.get_title() == title)
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata()), ln.get_color(), ln.get_linestyle())
            for ln in ax.get_lines()}


@pytest.fixture
def run_dir(tmp_path):
    with ScalarWriter(tmp_path / "train", tensorboard=False) as w:
        for step in range(1, 31):
            w.add_scalars(
                {"loss": 2.0 / step, "lr": 0.1, "loss_scale": 2.0 ** (step // 10)}, step
            )
    with ScalarWriter(tmp_path / "eval", tensorboard=False) as w:
        w.add_scalars({"loss": 0.2, "eval/accuracy": 0.93}, 30)
    return tmp_path


@pytest.fixture
def branched(tmp_path, monkeypatch):
    """Run "a" trains steps 1-6 and evaluates 3 and 6; run "b" restarts at step 3 (a branch), evaluates 6
    before its first train row; two eval runs evaluate step 8 (the same checkpoint, twice)."""
    md = tmp_path / "md"
    write(md / "train", "a", [(s, {"loss": 10.0 - s, "lr": 0.1}) for s in range(1, 7)], monkeypatch, t0=100)
    write(md / "eval", "a", [(3, {"loss": 7.5, "accuracy": 0.5}), (6, {"loss": 4.5, "accuracy": 0.6})],
          monkeypatch, t0=103.5)
    write(md / "eval", "b", [(6, {"loss": 3.0, "accuracy": 0.7})], monkeypatch, t0=199)
    write(md / "train", "b", [(s, {"loss": 5.0 - s / 2, "lr": 0.05}) for s in range(4, 9)], monkeypatch, t0=200)
    write(md / "eval", "c", [(8, {"loss": 1.5, "accuracy": 0.8})], monkeypatch, t0=300)
    write(md / "eval", "d", [(8, {"loss": 1.25, "accuracy": 0.8})], monkeypatch, t0=400)
    return md


def test_branch_is_two_segments_with_their_evals(branched):
    first, second = load_segments(branched)
    assert (first.number, first.runs, first.steps()) == (1, ["a"], (1, 6))
    assert first.train["loss"] == [(s, 10.0 - s) for s in range(1, 7)]
    assert first.eval == {"loss": [(3, 7.5), (6, 4.5)], "accuracy": [(3, 0.5), (6, 0.6)]}
    assert (second.runs, second.steps()) == (["b"], (4, 8))
    assert second.train["lr"] == [(s, 0.05) for s in range(4, 9)]
    # b's eval at 6 (written before b's first train row) is b's; the two eval runs of step 8 are one point.
    assert second.eval == {"loss": [(6, 3.0), (8, 1.25)], "accuracy": [(6, 0.7), (8, 0.8)]}


def test_figure_draws_each_segment_in_one_colour_across_panels(branched):
    pytest.importorskip("matplotlib")
    fig = make_figure([branched])
    loss, acc, lr = lines_of(fig, "loss"), lines_of(fig, "accuracy"), lines_of(fig, "lr")
    one, two = "#1 (steps 1-6)", "#2 (steps 4-8)"
    assert set(loss) == {f"{one} train", f"{one} eval", f"{two} train", f"{two} eval"}
    assert loss[f"{one} train"][:2] == ([1, 2, 3, 4, 5, 6], [9.0, 8.0, 7.0, 6.0, 5.0, 4.0])
    assert loss[f"{two} train"][:2] == ([4, 5, 6, 7, 8], [3.0, 2.5, 2.0, 1.5, 1.0])
    assert loss[f"{two} eval"][:2] == ([6, 8], [3.0, 1.25])
    assert set(acc) == {f"{one} eval", f"{two} eval"} and set(lr) == {f"{one} train", f"{two} train"}
    for seg in (one, two):
        colours = {loss[f"{seg} train"][2], loss[f"{seg} eval"][2], acc[f"{seg} eval"][2], lr[f"{seg} train"][2]}
        assert len(colours) == 1, seg
    assert loss[f"{one} train"][2] != loss[f"{two} train"][2]
    assert loss[f"{one} train"][3] == "-" and loss[f"{one} eval"][3] == "--"


def test_resume_that_continues_is_one_segment_marked_where_it_resumed(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    write(tmp_path / "train", "a", [(s, {"loss": 1.0 / s}) for s in (10, 20, 30)], monkeypatch)
    write(tmp_path / "train", "b", [(s, {"loss": 1.0 / s}) for s in (40, 50)], monkeypatch, t0=10)
    (seg,) = load_segments(tmp_path)
    assert (seg.runs, seg.resumed_at, [s for s, _ in seg.train["loss"]]) == (["a", "b"], [30], [10, 20, 30, 40, 50])
    lines = lines_of(make_figure([tmp_path]), "loss")
    assert lines["train"][:2] == ([10, 20, 30, 40, 50], [1.0 / s for s in (10, 20, 30, 40, 50)])
    assert lines["resumed"][0] == [30, 30] and lines["resumed"][3] == ":"  # a vertical at step 30


@pytest.mark.parametrize("steps, want", [
    ([1, 2, 3, 2, 3, 4], [[1, 2, 3], [2, 3, 4]]),  # goes back
    ([1, 2, 3, 3, 4], [[1, 2, 3], [3, 4]]),  # repeats (a crash after step 3's log, resumed from before it)
    ([1, 2, 3, 1, 2, 1], [[1, 2, 3], [1, 2], [1]]),  # restarted twice
    ([5, 6, 7, 8], [[5, 6, 7, 8]]),
])
def test_files_without_run_ids_split_where_steps_go_back_or_repeat(tmp_path, steps, want):
    # The four-column CSV of older versions: only the steps tell a restart.
    lines = ["step,tag,value,wall_time"] + [f"{s},{tag},{s}.5,{i}" for i, s in enumerate(steps) for tag in ("a", "b")]
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "scalars.csv").write_text("\n".join(lines) + "\n")
    segments = load_segments(tmp_path)
    assert [[s for s, _ in seg.train["a"]] for seg in segments] == want
    assert all(seg.train["a"] == seg.train["b"] for seg in segments)


def test_eval_only_model_dir_is_one_deduplicated_segment(tmp_path, monkeypatch):
    write(tmp_path / "eval", "a", [(10, {"loss": 2.0}), (20, {"loss": 1.0})], monkeypatch)
    write(tmp_path / "eval", "b", [(10, {"loss": 2.0}), (20, {"loss": 1.0}), (5, {"loss": 3.0})], monkeypatch)
    (seg,) = load_segments(tmp_path)
    assert seg.train == {} and seg.eval == {"loss": [(5, 3.0), (10, 2.0), (20, 1.0)]}


def test_logy_sets_log_scale_where_values_are_positive(tmp_path, monkeypatch, caplog):
    pytest.importorskip("matplotlib")
    write(tmp_path / "train", "a", [(s, {"loss": 10.0 ** -s, "delta": s - 2.0}) for s in (1, 2, 3)], monkeypatch)
    scales = {ax.get_title(): ax.get_yscale() for ax in make_figure([tmp_path], logy=True).axes if ax.get_visible()}
    assert scales == {"loss": "log", "delta": "linear"}
    assert "delta has values <= 0" in caplog.text
    assert {ax.get_yscale() for ax in make_figure([tmp_path]).axes} == {"linear"}


def test_several_model_dirs_overlaid_with_a_legend(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    write(tmp_path / "cpu" / "train", "a", [(s, {"loss": 1.0 / s}) for s in (1, 2)], monkeypatch)
    write(tmp_path / "csx" / "train", "b", [(s, {"loss": 2.0 / s}) for s in (1, 2)], monkeypatch)
    write(tmp_path / "csx" / "train", "c", [(1, {"loss": 3.0})], monkeypatch, t0=5)  # csx restarted
    fig = make_figure([tmp_path / "cpu", tmp_path / "csx"])
    lines = lines_of(fig, "loss")
    assert set(lines) == {"cpu train", "csx #1 (steps 1-2) train", "csx #2 (step 1) train"}
    assert lines["cpu train"][1] == [1.0, 0.5] and lines["csx #1 (steps 1-2) train"][1] == [2.0, 1.0]
    assert len({line[2] for line in lines.values()}) == 3
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert sorted(legend) == sorted(lines)

    out = tmp_path / "both.png"
    result = CliRunner().invoke(plot, [str(tmp_path / "cpu"), str(tmp_path / "csx"), "-o", str(out), "--logy"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert "csx: 2 segments" in result.output and "cpu:" not in result.output


def test_real_run_restarted_from_an_earlier_checkpoint(toy_project, tmp_path, monkeypatch):
    """cs-run train, then train again from checkpoint 10 with another learning rate (a branch), then eval
    twice: the plot has two train segments, each exactly its invocation's CSV rows."""
    pytest.importorskip("matplotlib")
    md = tmp_path / "md"

    def invoke(run_id, *args):
        monkeypatch.setattr("cs_run.summaries.RUN_ID", run_id)  # each cs-run process has its own
        result = CliRunner().invoke(cli, [*args, "--params", str(toy_project), "--model_dir", str(md)])
        assert result.exit_code == 0, result.output

    invoke("first", "train-and-eval")
    invoke("branch", "train-and-eval", "--checkpoint_path", str(md / "checkpoint_10.mdl"), "--max_steps", "30",
           "--set", "optimizer.learning_rate=0.02")
    invoke("eval1", "eval")
    invoke("eval2", "eval")
    with open(md / "train" / "scalars.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["tag"] == "loss"]
    want = {run: ([int(r["step"]) for r in rows if r["run"] == run], [float(r["value"]) for r in rows if r["run"] == run])
            for run in ("first", "branch")}
    assert want["first"][0] == [5, 10, 15, 20] and want["branch"][0] == [15, 20, 25, 30]
    assert want["first"][1][2] != want["branch"][1][0]  # the branch trained differently from step 10 on

    lines = lines_of(make_figure([md]), "loss")
    assert lines["#1 (steps 5-20) train"][:2] == want["first"]
    assert lines["#2 (steps 15-30) train"][:2] == want["branch"]
    assert lines["#1 (steps 5-20) eval"][0] == [20]
    assert lines["#2 (steps 15-30) eval"][0] == [30]  # the branch's eval and two eval runs: one point

    result = CliRunner().invoke(cli, ["plot", str(md)])
    assert result.exit_code == 0, result.output
    assert "2 segments" in result.output and (md / "scalars.png").read_bytes().startswith(PNG_MAGIC)


def test_plot_scalars_writes_png(run_dir, tmp_path):
    pytest.importorskip("matplotlib")
    out = plot_scalars(run_dir, tmp_path / "out" / "run.png")
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_plot_command(run_dir):
    pytest.importorskip("matplotlib")
    result = CliRunner().invoke(plot, [str(run_dir), "--tags", "loss,lr"])
    assert result.exit_code == 0, result.output
    assert (run_dir / "scalars.png").read_bytes().startswith(PNG_MAGIC)
    out = run_dir / "x.png"
    assert CliRunner().invoke(plot, [str(run_dir), "-o", str(out)]).exit_code == 0
    assert out.exists()


def test_plot_errors(run_dir, tmp_path):
    with pytest.raises(CsRunError, match="no scalars found"):
        plot_scalars(tmp_path / "train", tmp_path / "a.png")
    with pytest.raises(ParamsError, match="--tags: nope not found .* available: loss"):
        plot_scalars(run_dir, tmp_path / "a.png", tags=["nope"])
    result = CliRunner().invoke(plot, [])
    assert result.exit_code == 2 and "MODEL_DIRS" in result.output


def test_missing_matplotlib_gives_install_hint(run_dir, tmp_path, monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(CsRunError, match=r"pip install 'cs-run\[plot\]'"):
        plot_scalars(run_dir, tmp_path / "a.png")
