"""The README's commands run as written, in order, in a fresh copy of the repository.

Every fenced ``bash`` block of README.md runs (``set -e``: each command must succeed), in the order the
README gives them, with this checkout's ``cs-run`` first on PATH, as a reader who ran the Quick start
would. A block preceded by a ``<!-- not run by tests/test_readme.py: REASON -->`` line is skipped (setup
that this test's own environment already is). So a README that drifts from the code fails here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = re.compile(r"<!-- not run by tests/test_readme\.py: \S.* -->")


def readme_blocks(text: str) -> list[tuple[int, str, bool]]:
    """(line number, code, runs) of every fenced bash block, in order."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            start = i + 1
            end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            blocks.append((start + 1, "\n".join(lines[start:end]), not SKIP.fullmatch(before.strip())))
            i = end
        i += 1
    return blocks


def test_block_parser_finds_and_skips_blocks():
    text = ("# t\n```bash\necho a\n```\n<!-- not run by tests/test_readme.py: setup -->\n\n```bash\nmake run\n```\n"
            "```python\nx = 1\n```\n<!-- not run by tests/test_readme.py: -->\n```bash\necho b\n```\n")
    assert readme_blocks(text) == [(3, "echo a", True), (8, "make run", False), (15, "echo b", True)]


def _fresh_copy(dest: Path) -> None:
    """The repository's files as a fresh clone has them (tracked and new, not ignored; no model_dir/, .venv)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, timeout=60)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no clone to copy")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


@pytest.mark.slow
def test_readme_commands_run_in_order_on_a_fresh_clone(tmp_path):
    blocks = readme_blocks((ROOT / "README.md").read_text())
    runnable = [(line, code) for line, code, runs in blocks if runs]
    assert runnable and any("cs-run init" in code for _, code in runnable)
    clone = tmp_path / "cs-run"
    _fresh_copy(clone)
    assert not (clone / "model_dir").exists()
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    for line, code in runnable:
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-x", "-c", code], cwd=clone, env=env,
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, (f"README.md block at line {line} failed (exit {result.returncode}); mark a "
                                        f"block that cannot run here with <!-- not run by tests/test_readme.py: "
                                        f"REASON -->\n{result.stderr[-4000:]}\n{result.stdout[-2000:]}")
        assert "Traceback" not in result.stderr, result.stderr[-4000:]
    # what the commands say they leave behind
    assert (clone / "my_model" / "model_dir" / "checkpoint_150.mdl").is_file()
    assert sorted(p.name for p in (clone / "model_dir" / "fc_mnist").glob("checkpoint_*.mdl")) == \
        ["checkpoint_100.mdl", "checkpoint_50.mdl"]
    assert (clone / "resolved.yaml").read_text().count("max_steps: 10") == 1


MOVED_TO_DOCS = ("docs/performance.md", "docs/vendor-compatibility.md", "docs/replicas.md")
"""Pages that hold what the README once did (benchmarks, vendor compatibility, replicas in full): the README
links them, and their commands are checked as the README's are."""


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a page's headings (lower case, punctuation dropped, spaces as hyphens)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a '# comment' in a block is no heading
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in text.splitlines() if line.startswith("#")}


def test_anchor_rule_is_githubs():
    assert re.sub(r"[^\w\- ]", "", "fc_mnist's `model` keys".lower()).replace(" ", "-") == "fc_mnists-model-keys"


@pytest.mark.parametrize("page", ["README.md", *MOVED_TO_DOCS])
def test_links_to_pages_and_headings_resolve(page):
    """Every link of the README and of the pages its text moved to reaches an existing page and heading."""
    source = ROOT / page
    links = re.findall(r"\]\(([^)\s]+\.md)(#[^)\s]*)?\)", source.read_text())
    assert links or page != "README.md"
    for target, anchor in links:
        path = (source.parent / target).resolve()
        assert path.is_file(), f"{page}: {target} does not exist"
        if anchor:
            assert anchor[1:] in _anchors(path), f"{page}: {target}{anchor}: no such heading"


def test_the_readme_links_the_pages_its_text_moved_to():
    text = (ROOT / "README.md").read_text()
    assert all(f"]({page}" in text for page in MOVED_TO_DOCS)


@pytest.mark.parametrize("page", MOVED_TO_DOCS)
def test_the_moved_pages_commands_say_why_they_are_not_run(page):
    """tests/test_readme.py runs the README's blocks only: a block moved out must say where it is tested."""
    blocks = readme_blocks((ROOT / page).read_text())
    assert all(not runs for _, _, runs in blocks), [line for line, _, runs in blocks if runs]
