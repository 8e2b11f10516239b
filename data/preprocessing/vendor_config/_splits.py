"""``setup.data_splits`` / ``setup.context_splits``: the input records dealt into splits, as the vendor deals them.

The rules are the vendor's (Release 2.10 DataSplit), written down so a change is seen:

* the targets, in order: each data split in the file's order, and under it each of its (or the shared)
  context lengths ``MSL_List``; a shared context split alone gives one target per length;
* numpy's ``default_rng(split_seed)`` draws per record, in input order: a file index
  ``integers(0, n_files)`` (the split file is named after that input file, dots as ``_``), then the data
  split ``choice(n, p=fractions)``, then the context length the same way; fractions are normalized to sum 1;
* each record is written as one JSON line to ``data_splits_dir/SPLIT/msl_N/NAME.jsonl``; each target is then
  preprocessed from its folder into ``output_dir/SPLIT/msl_N`` with ``max_seq_length`` N (``1K`` is 1024).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

import numpy as np

from cs_run.errors import ParamsError

__all__ = ["SplitPlan", "normalize_msl", "plan_splits", "write_splits"]


@dataclass
class SplitPlan:
    """The checked split keys: targets (split name or None, MSL_List entry or None), and how to draw."""

    data_splits: dict  # name -> normalized fraction (ordered); empty for a shared context split alone
    context: list  # per data split (or one, shared alone): (MSL_List, normalized fractions)
    targets: list  # [(split name | None, msl entry | None)]
    splits_dir: str
    seed: int


def normalize_msl(value, fail) -> int:
    """An MSL_List entry as a length: 2048, "2K" (x1024), "0.5K"."""
    if isinstance(value, str):
        try:
            return int(float(re.sub("k", "", value, flags=re.IGNORECASE)) * 1024) if re.search("k", value, re.I) \
                else int(value)
        except ValueError:
            raise fail(f"has {value!r}", "give lengths as integers or as 1K, 2K, ...") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise fail(f"has {value!r}", "give whole lengths (2048) or 2K")
    return int(value)


def _fractions(values, fail, normalize: bool = True) -> list:
    try:
        floats = [float(Fraction(v)) if isinstance(v, str) and "/" in v else float(v) for v in values]
    except (TypeError, ValueError, ZeroDivisionError):
        raise fail(f"is {values!r}", "give numbers (0.8) or fractions ('4/5')") from None
    total = sum(floats)
    if not normalize:
        return floats
    return [v / total for v in floats] if total > 0 else floats


def plan_splits(setup: dict, processing: dict, output_dir: str, fail) -> Optional[SplitPlan]:
    """The plan, or None when neither key is set. ``fail(key, problem, fix)`` makes the one-line error."""
    data_splits, shared = setup.get("data_splits"), setup.get("context_splits")
    if not data_splits and not shared:
        return None
    if setup.get("processes", 1) != 1:
        raise fail("setup.processes", f"is {setup['processes']} with data splits", "set it to 1: the split each "
                   "record gets depends on the process count (cs-run deals them as one process)")

    def context(node: dict, key: str) -> tuple:
        if not isinstance(node, dict):
            raise fail(key, f"is {node!r}", "give MSL_List: [...] and split_fractions: [...]")
        msl, fractions = node.get("MSL_List"), node.get("split_fractions")
        if not isinstance(msl, list) or not msl:
            raise fail(f"{key}.MSL_List", f"is {msl!r}", "give the context lengths, e.g. [1K, 2K]")
        if not isinstance(fractions, list) or len(fractions) != len(msl):
            raise fail(f"{key}.split_fractions", f"is {fractions!r}", f"give {len(msl)} fractions, one per MSL_List entry")
        lengths = [normalize_msl(m, lambda p, f: fail(f"{key}.MSL_List", p, f)) for m in msl]
        if len(set(lengths)) != len(lengths):
            raise fail(f"{key}.MSL_List", f"repeats a length ({msl})", "give each context length once")
        return msl, _fractions(fractions, lambda p, f: fail(f"{key}.split_fractions", p, f))

    plan = SplitPlan({}, [], [], "", 0)
    if data_splits:
        if not isinstance(data_splits, dict):
            raise fail("setup.data_splits", f"is {data_splits!r}", "give train: {split_fraction: 0.8}, val: ...")
        raw = []
        for name, node in data_splits.items():
            if not isinstance(node, dict) or node.get("split_fraction") is None:
                raise fail(f"setup.data_splits.{name}", "has no split_fraction", "give split_fraction: 0.8")
            raw.append(node["split_fraction"])
        total = sum(_fractions(raw, lambda p, f: fail("setup.data_splits", p, f), normalize=False))
        if not math.isclose(total, 1.0):
            raise fail("setup.data_splits", f"fractions add up to {total}", "make the split_fraction values add up to 1")
        plan.data_splits = dict(zip(data_splits, _fractions(raw, lambda p, f: fail("setup.data_splits", p, f))))
        own = [name for name, node in data_splits.items() if node.get("context_splits")]
        if own and shared:
            raise fail("setup.context_splits", f"is given with data_splits.{own[0]}.context_splits",
                       "give context splits once: under each data split or shared, not both")
        for name, node in data_splits.items():
            if node.get("context_splits"):
                msl, fractions = context(node["context_splits"], f"setup.data_splits.{name}.context_splits")
                plan.context.append((msl, fractions))
                plan.targets += [(name, m) for m in msl]
            elif not shared:
                plan.targets.append((name, None))
    if shared:
        msl, fractions = context(shared, "setup.context_splits")
        if plan.data_splits:
            for name in plan.data_splits:
                plan.targets += [(name, m) for m in msl]
                plan.context.append((msl, fractions))
        else:
            plan.targets += [(None, m) for m in msl]
            plan.context.append((msl, fractions))
    plan.splits_dir = setup.get("data_splits_dir") or os.path.join(os.path.dirname(output_dir), "data_splits_dir")
    if not isinstance(plan.splits_dir, str):
        raise fail("setup.data_splits_dir", f"is {plan.splits_dir!r}", "give a folder")
    seed = processing.get("split_seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise fail("processing.split_seed", f"is {seed!r}", "give an integer")
    plan.seed = seed
    return plan


def target_dir(root: str, name: Optional[str], msl) -> str:
    """``root/NAME/msl_N`` (the parts a target has)."""
    path = os.path.join(root, name) if name else root
    return os.path.join(path, f"msl_{msl}") if msl is not None else path


def write_splits(plan: SplitPlan, files: list[str], source: str, rows) -> None:
    """Deal every record of ``files`` (read with ``rows(path)``) into the split folders under plan.splits_dir."""
    rng = np.random.default_rng(plan.seed)
    names = list(plan.data_splits)
    out: dict[str, list[str]] = {}
    for path in files:
        for _, record in rows(path):
            chosen = files[rng.integers(0, len(files))]
            rel = os.path.normpath(os.path.join(os.path.relpath(os.path.dirname(chosen), source),
                                                os.path.basename(chosen).replace(".", "_")))
            if not names:
                msl, fractions = plan.context[0]
                folder = target_dir(plan.splits_dir, None, msl[rng.choice(np.arange(len(fractions)), p=fractions)])
            else:
                index = rng.choice(np.arange(len(names)), p=list(plan.data_splits.values()))
                msl = None
                if plan.context:
                    lengths, fractions = plan.context[index]
                    msl = lengths[rng.choice(np.arange(len(fractions)), p=fractions)]
                folder = target_dir(plan.splits_dir, names[index], msl)
            out.setdefault(os.path.join(folder, rel + ".jsonl"), []).append(json.dumps(record))
    for path, lines in out.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))


def check_splits_dir(plan: SplitPlan, where: str) -> None:
    """The split folder must hold no split files yet (a rerun would append to them)."""
    if os.path.isdir(plan.splits_dir) and any(files for _, _, files in os.walk(plan.splits_dir)):
        raise ParamsError(f"data preprocess --config: setup.data_splits_dir {plan.splits_dir} already holds files "
                          f"({where}); give an empty or new folder")
