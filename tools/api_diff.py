"""Compare cs-run's installed public API with the vendor's cerebras-pytorch 2.10 names and signatures.

    python tools/api_diff.py            # prints every vendor name and its status; exit 1 on an undeclared mismatch

The vendor side is the data file ``tools/vendor_api_2.10.txt`` (read from the vendor's wheel); the
deliberate differences are ``tools/vendor_api_deliberate.txt`` (``<name>: <reason>``). A cs-run
signature matches when every vendor parameter is there at the same position (positional ones) or by
name (keyword-only), with the same default (or likewise required), ``*args`` / ``**kwargs`` where the
vendor has them; cs-run may add parameters only if they are optional. A deliberate entry that no longer
differs is reported too (stale), so the list stays true.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch  # evaluates vendor defaults such as torch.float32

HERE = Path(__file__).resolve().parent
VENDOR_FILE = HERE / "vendor_api_2.10.txt"
DELIBERATE_FILE = HERE / "vendor_api_deliberate.txt"
PREFIX = ("cerebras.pytorch", "cs_run")


@dataclass
class Entry:
    name: str
    kind: str
    params: Optional[list[tuple[str, str, Any]]]  # (name, kind, default or _REQUIRED)


_REQUIRED = object()


def read_vendor(path: Path = VENDOR_FILE) -> list[Entry]:
    entries = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition(" ")
        kind, paren, sig = rest.partition("(")
        entries.append(Entry(name, kind.strip(), _parse_sig("(" + sig) if paren else None))
    return entries


def read_deliberate(path: Path = DELIBERATE_FILE) -> dict[str, str]:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, _, reason = line.partition(":")
                out[name.strip()] = reason.strip()
    return out


def _parse_sig(sig: str) -> list[tuple[str, str, Any]]:
    fn = ast.parse(f"def f{sig}: pass").body[0].args
    env = {"torch": torch}
    out: list[tuple[str, str, Any]] = []
    positional = fn.posonlyargs + fn.args
    defaults = [None] * (len(positional) - len(fn.defaults)) + list(fn.defaults)
    for arg, default in zip(positional, defaults):
        out.append((arg.arg, "positional", _REQUIRED if default is None else eval(ast.unparse(default), env)))
    if fn.vararg:
        out.append((fn.vararg.arg, "var_positional", None))
    for arg, default in zip(fn.kwonlyargs, fn.kw_defaults):
        out.append((arg.arg, "keyword", _REQUIRED if default is None else eval(ast.unparse(default), env)))
    if fn.kwarg:
        out.append((fn.kwarg.arg, "var_keyword", None))
    return out


def resolve(vendor_name: str) -> Any:
    """The cs-run object for a vendor name (``cerebras.pytorch.x.y`` -> ``cs_run.x.y``)."""
    name = PREFIX[1] + vendor_name[len(PREFIX[0]):]
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for part in parts[i:]:
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            continue
    return importlib.import_module(name)


def _local_params(obj: Any) -> list[tuple[str, str, Any]]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    sig = inspect.signature(target)
    out = []
    params = list(sig.parameters.values())
    if inspect.isclass(obj) and params and params[0].name == "self":
        params = params[1:]
    kinds = {inspect.Parameter.POSITIONAL_ONLY: "positional", inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
             inspect.Parameter.VAR_POSITIONAL: "var_positional", inspect.Parameter.KEYWORD_ONLY: "keyword",
             inspect.Parameter.VAR_KEYWORD: "var_keyword"}
    for p in params:
        default = _REQUIRED if p.default is inspect.Parameter.empty else p.default
        out.append((p.name, kinds[p.kind], None if kinds[p.kind].startswith("var") else default))
    return out


def _same(a: Any, b: Any) -> bool:
    if a is _REQUIRED or b is _REQUIRED:
        return a is b
    try:
        return bool(a == b) and type(a) is type(b) or (a is None and b is None)
    except Exception:  # noqa: BLE001 - uncomparable defaults differ
        return False


def compare_signature(vendor: list, local: list) -> list[str]:
    """Differences that a call written for the vendor would notice."""
    problems = []
    local_pos = [p for p in local if p[1] == "positional"]
    by_name = {p[0]: p for p in local}
    has_var = {k for _, k, _ in local if k.startswith("var")}
    vendor_pos = [p for p in vendor if p[1] == "positional"]
    for i, (name, _, default) in enumerate(vendor_pos):
        if i >= len(local_pos) or local_pos[i][0] != name:
            got = local_pos[i][0] if i < len(local_pos) else "nothing"
            problems.append(f"positional {i} is {got!r}, vendor {name!r}")
            continue
        if not _same(default, local_pos[i][2]):
            problems.append(f"{name}: default {_show(local_pos[i][2])}, vendor {_show(default)}")
    for name, kind, default in vendor:
        if kind == "keyword":
            if name not in by_name:
                problems.append(f"keyword {name!r} missing")
            elif not _same(default, by_name[name][2]):
                problems.append(f"{name}: default {_show(by_name[name][2])}, vendor {_show(default)}")
        elif kind.startswith("var") and kind not in has_var:
            problems.append(f"no {'*' if kind == 'var_positional' else '**'}{name}")
    vendor_names = {p[0] for p in vendor}
    for name, kind, default in local:
        if name not in vendor_names and not kind.startswith("var") and default is _REQUIRED:
            problems.append(f"extra required parameter {name!r}")
    return problems


def _show(value: Any) -> str:
    return "required" if value is _REQUIRED else repr(value)


def check(entry: Entry) -> list[str]:
    try:
        obj = resolve(entry.name)
    except (ImportError, AttributeError):
        return ["missing"]
    if entry.kind == "module":
        return [] if inspect.ismodule(obj) else [f"is a {type(obj).__name__}, vendor a module"]
    if entry.kind == "property":
        owner, _, attr = entry.name.rpartition(".")
        cls = resolve(owner)
        return [] if isinstance(inspect.getattr_static(cls, attr), property) else ["not a property"]
    if entry.kind == "class" and not inspect.isclass(obj):
        return [f"is a {type(obj).__name__}, vendor a class"]
    if entry.kind == "function" and not callable(obj):
        return ["not callable"]
    if entry.params is None:
        return []
    try:
        local = _local_params(obj)
    except (TypeError, ValueError):
        return ["signature not inspectable"]
    return compare_signature(entry.params, local)


def run(out=sys.stdout) -> int:
    deliberate = read_deliberate()
    failures = 0
    entries = read_vendor()
    seen = set()
    for entry in entries:
        seen.add(entry.name)
        problems = check(entry)
        if problems and entry.name in deliberate:
            status = f"deliberate: {deliberate[entry.name]} [{'; '.join(problems)}]"
        elif problems:
            status = "MISMATCH: " + "; ".join(problems)
            failures += 1
        elif entry.name in deliberate:
            status = "STALE deliberate entry (now matches): remove it"
            failures += 1
        else:
            status = "ok"
        print(f"{entry.name:60s} {status}", file=out)
    for name in sorted(set(deliberate) - seen):
        print(f"{name:60s} STALE deliberate entry (not in the vendor list)", file=out)
        failures += 1
    print(f"\n{len(entries)} vendor names: {failures} undeclared mismatch(es)", file=out)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(run())
