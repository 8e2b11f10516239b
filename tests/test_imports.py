"""Import structure: every module imports on its own in a fresh interpreter, no module-level import cycle
exists (ruff's PLC0415 keeps function-local imports out, except for the heavy optional packages), every
module imports only its own layer and the layers below it (docs/architecture.md#layers), and no private
module (``_name``) is imported from outside its package. Module paths written as strings (``"pkg.mod:attr"``,
``"cs_run.x.y"``: what a registry or a lazy command table imports later) follow the same layer rule, and
no module outside the examples names one.

The package map (cs_run.runners is the runners/ folder, ...) is read from setup.cfg, the file that
installs it.
"""

from __future__ import annotations

import ast
import configparser
import json
import re
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
failures, running = {}, {}
def reap():
    pid, status = os.wait()
    name = running.pop(pid)
    if status:
        failures[name] = status
for name in names:
    if len(running) >= max(1, min(2, os.cpu_count() or 1)):  # two at a time: each child is one core's work
        reap()
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            sys.stderr.write(f"{name}: " + traceback.format_exc(limit=-3))
            os._exit(1)
        os._exit(0)
    running[pid] = name
while running:
    reap()
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


# docs/architecture.md#layers, top to bottom: a module may import its own layer and the layers below it.
# A module is in the layer of the longest name here that it is, or is inside of (``cs_run`` itself is only
# the package's __init__, which loads the public names on first use).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("entry points", ("cs_run.__main__", "cs_run.examples", "cs_run.data")),  # cs_run.data: until its readers leave examples/
    ("front ends", ("cs_run", "cs_run.frontends")),
    ("runners", ("cs_run.runners",)),
    ("models", ("cs_run.models",)),
    ("data", ("cs_run.data",)),
    ("cstorch API", ("cs_run.tracing", "cs_run.utils", "cs_run.backend", "cs_run.distributed", "cs_run.amp",
                     "cs_run.metrics", "cs_run.saving", "cs_run.experimental", "cs_run.sparse")),
    ("engine", ("cs_run.engine",)),
    ("shared rules", ("cs_run.schedule", "cs_run.batches", "cs_run.interrupts", "cs_run.params", "cs_run.resolve",
                      "cs_run.registry", "cs_run.exits", "cs_run.summaries", "cs_run.vendor_params",
                      "cs_run.cluster_config", "cs_run.sparsity_params", "cs_run.lora_params")),
    ("parallel", ("cs_run.parallel",)),
    ("replicas", ("cs_run.replicas",)),
    ("leaves", ("cs_run.optim", "cs_run.checkpoint", "cs_run.creation", "cs_run.errors", "cs_run._checks",
                "cs_run._frames", "cs_run._logging", "cs_run._yaml", "cs_run._version_check", "cs_run._torch_compat",
                "cs_run._launcher_watch")),
]
"""The front ends (the command line, ``run()``, ``Trainer``, the vendor import paths) live in
cs_run/frontends/ and only there: every other module of cs_run/ is the core below the runners. The package's
``__init__`` (``cs_run``, the public names ``import cs_run as cstorch`` loads on first use) is a front end too:
it imports nothing at module level but the version check and the launcher watch, and the CLI reaches the runners through it lazily."""


def layer_of(module: str) -> int:
    """The index of ``module``'s layer in LAYERS (0 is the top); KeyError for a module no layer names."""
    found = [(len(name), index) for index, (_, names) in enumerate(LAYERS) for name in names
             if module == name or ("." in name and module.startswith(name + "."))]
    if not found:
        raise KeyError(module)
    return max(found)[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``importer (layer) -> imported (layer)`` for every import of a module in a higher layer."""
    return sorted(f"{m} ({LAYERS[layer_of(m)][0]}) -> {t} ({LAYERS[layer_of(t)][0]})"
                  for m, targets in graph.items() for t in targets if layer_of(t) < layer_of(m))


def private_imports(graph: dict[str, set[str]], packages: set[str]) -> set[tuple[str, str]]:
    """(importer, private module) pairs where the importer is outside the package that holds the private
    module (a private module serves its package and that package's subpackages)."""
    out = set()
    for m, targets in graph.items():
        for t in targets:
            parts = t.split(".")
            private = [i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")]
            if not private:
                continue
            owner = ".".join(parts[: private[0]])
            home = m if m in packages else m.rsplit(".", 1)[0]
            if home != owner and not home.startswith(owner + "."):
                out.add((m, t))
    return out


def test_the_layer_rule_finds_upward_and_private_imports():
    graph = {"cs_run.checkpoint.h5": {"cs_run.replicas", "cs_run.errors"}, "cs_run.runners.base": {"cs_run.engine"},
             "cs_run.params": {"cs_run.frontends.options"}, "cs_run.runners._step": {"cs_run.runners._rng"},
             "cs_run.frontends.trainer": {"cs_run.runners._checkpoints", "cs_run._checks", "cs_run.runners"},
             "cs_run.frontends.cli": {"cs_run.frontends._flags", "cs_run.frontends.options"},
             "cs_run.frontends.compat.cli": {"cs_run.frontends._flags", "cs_run.engine._private"}}
    assert upward_imports(graph) == ["cs_run.checkpoint.h5 (leaves) -> cs_run.replicas (replicas)",
                                     "cs_run.params (shared rules) -> cs_run.frontends.options (front ends)"]
    assert layer_of("cs_run.__main__") == 0 and layer_of("cs_run") == layer_of("cs_run.frontends.compat.trainer") == 1
    assert layer_of("cs_run.models.gpt2") == 3 and layer_of("cs_run.data.readers") == 4
    assert layer_of("cs_run.optim._docs") == 10
    assert private_imports(graph, {"cs_run", "cs_run.frontends"}) == {
        ("cs_run.frontends.trainer", "cs_run.runners._checkpoints"),
        ("cs_run.frontends.compat.cli", "cs_run.engine._private")}
    with pytest.raises(KeyError):
        layer_of("cs_run.somewhere_new")


def test_the_front_ends_are_the_frontends_folder_and_the_core_sits_below_the_runners(modules):
    # a module of cs_run/ outside frontends/ (the core) in a layer at or above the runners would put a
    # front door back into the core's folder, and a front end elsewhere would leave the folder's promise
    runners = layer_of("cs_run.runners")
    core = [m for m in modules if m.startswith("cs_run.") and m.split(".")[1] not in
            {"frontends", "runners", "examples", "models", "data", "optim", "checkpoint", "parallel", "__main__"}]
    assert core and [m for m in core if layer_of(m) <= runners] == []
    assert {m for m in modules if layer_of(m) == layer_of("cs_run.frontends")} == \
        {"cs_run"} | {m for m in modules if m.startswith("cs_run.frontends")}


def test_every_module_has_a_layer(modules):
    missing = []
    for name in modules:
        try:
            layer_of(name)
        except KeyError:
            missing.append(name)
    assert missing == [], "modules in no layer (add them to LAYERS and docs/architecture.md#layers): " + \
        ", ".join(missing)


def test_no_module_imports_a_layer_above_it(modules):
    found = upward_imports(import_graph(modules))
    assert found == [], "imports of a higher layer (docs/architecture.md#layers):\n" + "\n".join(found)


def test_no_private_module_is_imported_from_outside_its_package(modules):
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    found = private_imports(import_graph(modules), packages)
    assert found == set(), "private modules imported from outside their package: " + \
        ", ".join(f"{m} -> {t}" for m, t in sorted(found))


def test_the_docs_show_the_same_layers_in_the_same_order():
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")]
    assert rows[1:] == [name for name, _ in LAYERS]  # rows[0] is the header


_MODULE_PATH = re.compile(r"([A-Za-z_][\w.]*)(?::[A-Za-z_][\w.]*)?")

STRING_PATHS_ALLOWED = {
    ("cs_run.registry", "cs_run.models"): "the model registry imports the model home once, on its first lookup, so "
                                          "the families register themselves (the core names no model)",
    ("cs_run.registry", "cs_run.data.processors"): "the data processor registry imports the data home's processors "
                                                   "once, on its first lookup, so they register themselves",
    ("cs_run.frontends.cli", "cs_run.examples"): "cs-run init and the default --params copy the examples' files "
                                                 "(package resources, not code)",
    ("cs_run._yaml", "cs_run.params"): "a logger's name: the duplicate-key notes are logged as the params reader's "
                                       "(nothing is imported)",
    ("cs_run.engine.state", "cs_run.tracing"): "a function's __module__ compared: cstorch.trace's wrapper is walked "
                                               "through to the user's step (nothing is imported)",
}
"""(module, named module) pairs whose string may cross the layers upward, and why: the discovery of a registry's
homes, the front end that copies the bundled examples, and two names that are compared or logged under, never
imported. Nothing else names a higher layer or an example."""


def string_module_paths(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules its string literals name: a whole string ``"pkg.mod:attr"`` or a dotted
    ``"cs_run.x.y"``, whose module part is a module of the tree (prose, f-strings' parts and other strings are not
    module paths). A ``"cs_run.x:attr"`` whose module is not in the tree is kept as written, to be reported."""
    found: dict[str, set[str]] = {}
    for name, path in modules.items():
        named = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                match = _MODULE_PATH.fullmatch(node.value.strip())
                target = match and match.group(1)
                if target and target != name and target in modules and ("." in target or ":" in node.value):
                    named.add(target)
                elif target and target.startswith("cs_run.") and ":" in node.value and target not in modules:
                    named.add(node.value.strip())
        found[name] = named
    return found


def crossing_strings(strings: dict[str, set[str]]) -> list[str]:
    """``module (layer) -> named (layer)`` for each string naming a higher layer, or an example from outside the
    examples, that :data:`STRING_PATHS_ALLOWED` does not list, and for each ``module:attr`` naming no module."""
    out = []
    for m, targets in strings.items():
        for t in targets:
            if ":" in t:  # kept as written: its module is not in the tree
                out.append(f"{m} ({LAYERS[layer_of(m)][0]}) -> '{t}' (no such module)")
                continue
            example = t.split(".")[:2] == ["cs_run", "examples"] and not m.startswith("cs_run.examples")
            if (layer_of(t) < layer_of(m) or example) and (m, t) not in STRING_PATHS_ALLOWED:
                out.append(f"{m} ({LAYERS[layer_of(m)][0]}) -> '{t}' ({LAYERS[layer_of(t)][0]})")
    return sorted(out)


def test_the_string_rule_finds_upward_and_example_paths(tmp_path):
    files = {name: tmp_path / f"{name}.py" for name in ("cs_run.models.common.family", "cs_run.examples.gpt2.data",
                                                         "cs_run.runners.base", "cs_run.registry", "cs_run.errors")}
    files["cs_run.examples.gpt2.data"].write_text("")
    files["cs_run.models.common.family"].write_text(
        'DATA = "cs_run.examples.gpt2.data:build_dataloader"\nDOC = "see cs_run.errors for the types"\n')
    files["cs_run.errors"].write_text('def f():\n    return "cs_run.runners.base"\nNAME = f"{__name__}.x"\n')
    files["cs_run.registry"].write_text('HOMES = ("cs_run.models.common.family", "cs_run.nowhere")\n'
                                        'DATA = "cs_run.examples.gpt2.gone:build"\n')
    files["cs_run.runners.base"].write_text('LOGGER = "cs_run.errors"\n')
    strings = string_module_paths(files)
    assert strings["cs_run.models.common.family"] == {"cs_run.examples.gpt2.data"}  # not the prose
    assert strings["cs_run.errors"] == {"cs_run.runners.base"} and strings["cs_run.runners.base"] == {"cs_run.errors"}
    assert crossing_strings(strings) == [
        "cs_run.errors (leaves) -> 'cs_run.runners.base' (runners)",
        "cs_run.models.common.family (models) -> 'cs_run.examples.gpt2.data' (entry points)",
        "cs_run.registry (shared rules) -> 'cs_run.examples.gpt2.gone:build' (no such module)",
        "cs_run.registry (shared rules) -> 'cs_run.models.common.family' (models)"]


def test_no_module_names_a_higher_layer_or_an_example_in_a_string(modules):
    strings = string_module_paths(modules)
    found = crossing_strings(strings)
    assert found == [], "module paths in strings that cross the layers (docs/architecture.md#layers):\n" + \
        "\n".join(found)
    stale = [pair for pair in STRING_PATHS_ALLOWED if pair[1] not in strings.get(pair[0], ())]
    assert stale == [], f"STRING_PATHS_ALLOWED lists strings no longer written: {stale}"
