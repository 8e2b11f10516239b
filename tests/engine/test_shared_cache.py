"""The compile cache is one per user, shared by every model_dir: where it is, what its key separates, and
that concurrent writers and an unusable folder cost nothing but the cache (engine/cache.py)."""

from __future__ import annotations

import logging
import os
import threading

import pytest
import torch

from cs_run.engine import CompiledStep, EngineOptions, cache
from cs_run.engine.cache import CompileCache, default_cache_dir, graph_key
from cs_run.engine.state import discover_state
from cs_run.engine.trace import trace_step

HOME = "/home/someone"
# env (None: unset) -> the folder: CS_RUN_CACHE_DIR wins, then XDG_CACHE_HOME (absolute only, as the XDG
# spec says), then ~/.cache; torch.compile's inductor cache follows the same rule.
DIRS = [
    ({"CS_RUN_CACHE_DIR": "/c/cs", "XDG_CACHE_HOME": "/x"}, "/c/cs"),
    ({"CS_RUN_CACHE_DIR": "~/mine", "XDG_CACHE_HOME": None}, f"{HOME}/mine"),
    ({"CS_RUN_CACHE_DIR": "", "XDG_CACHE_HOME": "/x"}, "/x/cs-run"),
    ({"CS_RUN_CACHE_DIR": None, "XDG_CACHE_HOME": "/x"}, "/x/cs-run"),
    ({"CS_RUN_CACHE_DIR": None, "XDG_CACHE_HOME": "relative"}, f"{HOME}/.cache/cs-run"),
    ({"CS_RUN_CACHE_DIR": None, "XDG_CACHE_HOME": None}, f"{HOME}/.cache/cs-run"),
]


@pytest.mark.parametrize("env, expected", DIRS)
def test_the_default_cache_folder(env, expected, monkeypatch):
    monkeypatch.setenv("HOME", HOME)
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert default_cache_dir() == expected


def _traced(values: list[float]):
    weight = torch.nn.Parameter(torch.ones(3))

    def step(x):  # a tensor made in the step from Python values is a graph constant: its bytes live in the graph
        return (x * weight).sum() + torch.tensor(values).sum()

    x = torch.ones(3)
    return trace_step(step, discover_state(step), (x,), {}), x


def test_the_key_separates_graphs_that_differ_only_in_a_large_constant_or_cs_runs_version(monkeypatch):
    """Every byte of every constant counts (a compiled library embeds them); so does cs-run's version."""
    a, x = _traced([1.0] * 5000)
    b, _ = _traced([1.0] * 4999 + [2.0])
    assert a.gm.code == b.gm.code  # the same code: only the constant's values differ
    assert graph_key(a, [x], "inductor") != graph_key(b, [x], "inductor")
    assert graph_key(a, [x], "fx") == graph_key(_traced([1.0] * 5000)[0], [x], "fx")  # deterministic
    before = graph_key(a, [x], "fx")
    monkeypatch.setattr(cache, "_cs_run_version", lambda: "99.0")
    assert graph_key(a, [x], "fx") != before


def test_an_entry_is_a_hit_only_under_the_key_it_names(tmp_path):
    c = CompileCache(tmp_path)
    traced, x = _traced([1.0] * 5000)
    key = graph_key(traced, [x], "fx")
    foreign = c.entries / key
    foreign.mkdir(parents=True)
    (foreign / "summary.json").write_text('{"key": "another graph"}')  # renamed, or written by a version without keys
    assert not c.has(key)
    c.store(key, traced, "fx", 0.0)
    assert c.has(key) and (foreign / "graph.py").read_text() == traced.gm.code


def test_concurrent_writers_of_one_entry_leave_one_whole_entry(tmp_path):
    c = CompileCache(tmp_path)
    traced, x = _traced([1.0] * 5000)
    key = graph_key(traced, [x], "fx")
    start = threading.Barrier(8)

    def write():
        start.wait()
        c.store(key, traced, "fx", 0.0)

    threads = [threading.Thread(target=write) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.has(key) and sorted(p.name for p in c.entries.iterdir()) == [key]  # no temporaries left
    assert (c.entries / key / "graph.py").read_text() == traced.gm.code


def test_an_unusable_default_folder_costs_the_cache_not_the_run(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("CS_RUN_CACHE_DIR", str(blocker / "cs-run"))
    import cs_run as cstorch

    backend = cstorch.backend("CSX")
    weight = torch.nn.Parameter(torch.ones(3))

    def step(x):
        return (x * weight).sum()

    with caplog.at_level(logging.WARNING, logger="cs_run"):
        out = CompiledStep(step, backend.engine_options())(torch.arange(3.0))
    assert out.item() == 3.0
    assert [r.getMessage() for r in caplog.records if "compile cache" in r.getMessage()] == [
        f"compile cache: {blocker} is not a folder; compiling without the cache in {blocker / 'cs-run'} (nothing is "
        "reused or saved); give --compile_dir a writable folder (or set CS_RUN_CACHE_DIR)"]


def test_a_new_cache_folder_is_the_users_alone(tmp_path, monkeypatch):
    root = tmp_path / "fresh" / "cs-run"
    monkeypatch.setenv("CS_RUN_CACHE_DIR", str(root))
    weight = torch.nn.Parameter(torch.ones(3))
    CompiledStep(lambda x: (x * weight).sum(), EngineOptions(compile_tier="fx", compile_dir=default_cache_dir()))(
        torch.ones(3))
    assert root.is_dir() and (root.stat().st_mode & 0o777) == 0o700
    assert len(list((root / "cs_run_cache").iterdir())) == 1 and os.access(root, os.W_OK)
