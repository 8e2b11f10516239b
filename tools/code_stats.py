"""Size and coupling counts of the package folders, for a clean-up's before-and-after note (issue 35).

Prints the largest function and class, the functions over 60 lines, the places the name ``sharding`` is
read, and the string literals that name a module (``"cs_run.x.y"``, ``"cs_run.x:attr"``), with those
that name a module of a higher layer than their own (an import the layer test in tests/test_imports.py
cannot see). Stdlib only (ast), so it runs on any checkout without an install::

    python tools/code_stats.py [--list] [--root DIR]
"""

from __future__ import annotations

import argparse
import ast
import configparser
import re
import sys
from collections.abc import Iterator
from pathlib import Path

LONG = 60
"""A function longer than this many lines (``def`` to its last line) is counted as long."""

MODULE_PATH = re.compile(r"^cs_run(\.[A-Za-z_][A-Za-z0-9_]*)+(:[A-Za-z_][A-Za-z0-9_.]*)?$")
"""A whole string literal that is a dotted module path under cs_run, optionally with ``:attr``."""

FOLDERS = ("cs_run", "runners", "optim", "checkpoint", "models", "parallel", "data", "examples")


def package_map(root: Path) -> dict[str, str]:
    """Folder -> package name, from setup.cfg's ``package_dir`` (``cs_run.optim = optim``)."""
    config = configparser.ConfigParser()
    config.read(root / "setup.cfg")
    raw = config.get("options", "package_dir", fallback="")
    pairs = (line.split("=", 1) for line in raw.splitlines() if "=" in line)
    return {folder.strip(): package.strip() for package, folder in pairs}


def layers(root: Path) -> list[tuple[str, ...]]:
    """The module prefixes of each layer, top first, read (not imported) from tests/test_imports.py."""
    path = root / "tests" / "test_imports.py"
    if not path.exists():
        return []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "LAYERS" for t in targets) and node.value is not None:
                return [names for _, names in ast.literal_eval(node.value)]
    return []


def layer_of(module: str, table: list[tuple[str, ...]]) -> int | None:
    """``module``'s layer index (0 is the top) by its longest matching prefix, as the import test reads it."""
    found = [(len(name), index) for index, names in enumerate(table) for name in names
             if module == name or ("." in name and module.startswith(name + "."))]
    return max(found)[1] if found else None


def modules(root: Path) -> Iterator[tuple[Path, str]]:
    """Each ``.py`` file of the package folders with its dotted module name."""
    mapping = package_map(root)
    for folder in FOLDERS:
        base = root / folder
        if not base.is_dir():
            continue
        package = mapping.get(folder, folder)
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield path, ".".join([package, *parts])


def definitions(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """Every function and class with its qualified name (``Class.method``, ``outer.<locals>.inner``)."""
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[ast.AST, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                yield child, name
                inner = name + (".<locals>." if not isinstance(child, ast.ClassDef) else ".")
                yield from walk(child, inner)
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def sharding_reads(tree: ast.AST) -> int:
    """Places that name ``sharding``: a ``"sharding"`` key, an ``.sharding`` attribute, a variable or argument."""
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == "sharding":
            count += 1
        elif isinstance(node, ast.Attribute) and node.attr == "sharding":
            count += 1
        elif isinstance(node, ast.Name) and node.id == "sharding":
            count += 1
        elif isinstance(node, ast.keyword) and node.arg == "sharding":
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the checkout to measure (default: the one this file is in)")
    parser.add_argument("--list", action="store_true",
                        help=f"list the functions over {LONG} lines and the module-path strings")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    table = layers(root)
    functions: list[tuple[int, str, str]] = []
    classes: list[tuple[int, str, str]] = []
    paths: list[tuple[str, str, bool]] = []  # (file:line, literal, names a higher layer)
    sharding: dict[str, int] = {}
    files = 0
    for path, module in modules(root):
        files += 1
        where = str(path.relative_to(root))
        tree = ast.parse(path.read_text(), filename=where)
        for node, name in definitions(tree):
            size = node.end_lineno - node.lineno + 1
            bucket = classes if isinstance(node, ast.ClassDef) else functions
            bucket.append((size, name, f"{where}:{node.lineno}"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_PATH.match(node.value):
                named = node.value.split(":", 1)[0]
                own, target = layer_of(module, table), layer_of(named, table)
                upward = own is not None and target is not None and target < own
                paths.append((f"{where}:{node.lineno}", node.value, upward))
        if count := sharding_reads(tree):
            sharding[where] = count
    functions.sort(key=lambda row: (-row[0], row[1]))
    classes.sort(key=lambda row: (-row[0], row[1]))
    long = [row for row in functions if row[0] > LONG]
    upward = [row for row in paths if row[2]]
    print(f"files: {files} in {', '.join(f for f in FOLDERS if (root / f).is_dir())}")
    if functions:
        print(f"largest function: {functions[0][0]} lines, {functions[0][1]} ({functions[0][2]})")
    if classes:
        print(f"largest class: {classes[0][0]} lines, {classes[0][1]} ({classes[0][2]})")
    print(f"functions over {LONG} lines: {len(long)}")
    print(f"'sharding' named: {sum(sharding.values())} places in {len(sharding)} files")
    print(f"module-path strings: {len(paths)} ({len(upward)} name a higher layer)")
    if args.list:
        print(f"\nfunctions over {LONG} lines:")
        for size, name, where in long:
            print(f"  {size:4d}  {name}  {where}")
        print("\n'sharding' by file:")
        for where, count in sorted(sharding.items(), key=lambda item: (-item[1], item[0])):
            print(f"  {count:4d}  {where}")
        print("\nmodule-path strings (^ names a higher layer):")
        for where, literal, up in paths:
            print(f"  {'^' if up else ' '} {literal}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
