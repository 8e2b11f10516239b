"""plot_scalars / `cs-run plot`: a PNG from the CSVs ScalarWriter writes; clear errors otherwise."""

from __future__ import annotations

import builtins

import pytest
from click.testing import CliRunner

from cs_run.errors import CsRunError, ParamsError
from cs_run.plot import plot, plot_scalars
from cs_run.summaries import ScalarWriter

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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
    with pytest.raises(ParamsError, match="available: loss"):
        plot_scalars(run_dir, tmp_path / "a.png", tags=["nope"])


def test_missing_matplotlib_gives_install_hint(run_dir, tmp_path, monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(CsRunError, match=r"pip install 'cs-run\[plot\]'"):
        plot_scalars(run_dir, tmp_path / "a.png")
