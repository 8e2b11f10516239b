"""Import structure: every module imports on its own in a fresh interpreter, and no module-level import
cycle exists (ruff's PLC0415 keeps function-local imports out, except for the heavy optional packages).

The package map (cs_run.runners is the runners/ folder, ...) is read from setup.cfg, the file that
installs it.
"""

from __future__ import annotations

import ast
import configparser
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def package_dirs() -> dict[str, Path]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    pairs = [line.split("=") for line in cfg["options"]["package_dir"].strip().splitlines()]
    return {name.strip(): ROOT / folder.strip() for name, folder in pairs}


def all_modules() -> dict[str, Path]:
    """Every module of the installed packages, by dotted name (a package by its __init__.py)."""
    roots = package_dirs()
    modules: dict[str, Path] = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
                continue
            modules[".".join([package, *parts])] = path
    return modules


def _top_level_imports(tree: ast.Module) -> list[ast.stmt]:
    """Import statements that run at import time: module level, inside top-level if/try/with, and class
    bodies; not function bodies, not ``if TYPE_CHECKING:``."""
    found: list[ast.stmt] = []
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            if "TYPE_CHECKING" in ast.unparse(node.test):
                stack.extend(node.orelse)
            else:
                stack.extend(node.body + node.orelse)
        elif isinstance(node, (ast.Try, ast.With)):
            stack.extend(node.body)
            stack.extend(getattr(node, "orelse", []) + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                stack.extend(handler.body)
        elif isinstance(node, ast.ClassDef):
            stack.extend(node.body)
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules its module-level imports load (``from pkg import mod`` is pkg.mod)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _top_level_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_the_import_forms_that_make_cycles(tmp_path):
    files = {name: tmp_path / f"{name}.py" for name in ("cs_run", "cs_run.engine", "cs_run.engine.step",
                                                         "cs_run.late", "cs_run.m")}
    for path in files.values():
        path.write_text("")
    files["cs_run.m"].write_text("import cs_run\nfrom cs_run import engine\nfrom cs_run.engine import step\n"
                                 "try:\n    from cs_run.engine import RecompileError\nexcept ImportError:\n    pass\n"
                                 "def f():\n    import cs_run.late\n")
    graph = import_graph(files)
    assert graph["cs_run.m"] == {"cs_run", "cs_run.engine", "cs_run.engine.step"}  # not the function's


@pytest.fixture(scope="module")
def modules() -> dict[str, Path]:
    found = all_modules()
    assert {"cs_run", "cs_run.engine.step", "cs_run.runners.base", "cs_run.optim.sgd",
            "cs_run.checkpoint.h5", "cs_run.models.fc_mnist.model"} <= set(found)
    return found


def test_no_module_level_import_cycle(modules):
    found = cycles(import_graph(modules))
    assert found == [], "module-level import cycles among: " + "; ".join(", ".join(c) for c in found)


_IMPORT_EACH = r"""
import importlib, json, os, sys, traceback
import torch  # once, before forking: each child then pays only for cs-run's own modules
names = json.loads(sys.argv[1])
failures = {}
for name in names:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            sys.stderr.write(traceback.format_exc(limit=-3))
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status:
        failures[name] = status
print(json.dumps(failures))
"""


def test_every_module_imports_alone_in_a_fresh_interpreter(modules):
    # `import cs_run.x.y` always runs cs_run/__init__ first, so every module `import cs_run` loads imports
    # alone exactly as it does there; each of the others gets a fresh process (forked after torch).
    probe = subprocess.run([sys.executable, "-c", "import cs_run, json, sys; "
                            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('cs_run'))))"],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert probe.returncode == 0, probe.stderr
    loaded = set(json.loads(probe.stdout))
    alone = ["cs_run"] + sorted(set(modules) - loaded)
    result = subprocess.run([sys.executable, "-c", _IMPORT_EACH, json.dumps(alone)], capture_output=True,
                            text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}, result.stderr
    assert set(modules) <= loaded | set(alone)
