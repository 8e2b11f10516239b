"""tools/code_stats.py on a made-up checkout whose counts are known by hand: the largest function and class,
the functions over 60 lines, the ``sharding`` places and the module-path strings that name a higher layer."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import textwrap
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "code_stats.py"


def _tool():
    spec = importlib.util.spec_from_file_location("code_stats", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _checkout(root: Path) -> None:
    (root / "setup.cfg").write_text("[options]\npackage_dir =\n    cs_run = cs_run\n    cs_run.optim = optim\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_imports.py").write_text(textwrap.dedent('''
        LAYERS: list = [("runners", ("cs_run.runners",)), ("api", ("cs_run.metrics",)), ("leaves", ("cs_run.optim",))]
    '''))
    (root / "cs_run" / "metrics").mkdir(parents=True)
    long_body = "".join(f"    x{i} = {i}\n" for i in range(61))  # def + 61 lines = 62 lines
    (root / "cs_run" / "metrics" / "__init__.py").write_text(
        "def long():\n" + long_body + "\n\ndef short():\n    return 'cs_run.runners.base:Runner'\n")
    (root / "optim").mkdir()
    (root / "optim" / "sgd.py").write_text(textwrap.dedent('''
        class SGD:
            def step(self, params):
                sharding = params["sharding"]
                return sharding, "cs_run.optim.adam", "cs_run.metrics", "cs_run.x y"

            def other(self, strategy):
                return strategy.sharding
    '''))


def test_counts_of_a_known_tree(tmp_path):
    _checkout(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert _tool().main(["--root", str(tmp_path), "--list"]) == 0
    text = out.getvalue()
    assert "files: 2 in cs_run, optim\n" in text
    assert "largest function: 62 lines, long (cs_run/metrics/__init__.py:1)\n" in text
    assert "largest class: 7 lines, SGD (optim/sgd.py:2)\n" in text
    assert "functions over 60 lines: 1\n" in text and "    62  long  cs_run/metrics/__init__.py:1\n" in text
    # params["sharding"], the variable twice (assigned, returned), strategy.sharding
    assert "'sharding' named: 4 places in 1 files\n" in text
    # metrics (api) names the runners above it; optim (leaves) names metrics above it; optim.adam is its own layer
    assert "module-path strings: 3 (2 name a higher layer)\n" in text
    assert "  ^ cs_run.runners.base:Runner  cs_run/metrics/__init__.py:" in text
    assert "    cs_run.optim.adam  optim/sgd.py:" in text
