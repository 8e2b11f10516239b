"""The first Model Zoo release that names each decoder ``model:`` key: the ``since`` of the config fields in
``models/common/config.py`` (a harness, not a test; it reads a local mirror of github:Cerebras/modelzoo)::

    python tools/key_releases.py [--mirror DIR]

Per tag (oldest first), one ``git grep -w`` of every key over the gpt2/gptj PyTorch model code, the layers
and the decoder params files; prints ``key: first tag`` for every field of the decoder config classes and
marks a field whose ``since`` differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess

from cs_run.models.common.config import DecoderConfig
from cs_run.models.common.parallel import ParallelDecoderConfig

MIRROR = "/work/.mirror/Cerebras+modelzoo/repo"
PATHS = [":(glob)**/pytorch/gpt2/*.py", ":(glob)**/pytorch/gptj/*.py", ":(glob)**/nlp/gpt2/*.py",
         ":(glob)**/nlp/gptj/*.py", ":(glob)**/pytorch/*/configs/*.yaml", ":(glob)**/nlp/*/configs/*.yaml",
         ":(glob)**/pytorch/layers/*.py", ":(glob)**/modelzoo/layers/*.py"]


def first_releases(keys: list[str], mirror: str) -> dict[str, str]:
    """key -> the oldest tag (as ``major.minor.patch``) whose files name it."""
    git = ["git", f"--git-dir={mirror}"]
    tags = sorted(subprocess.run([*git, "tag"], capture_output=True, text=True, check=True).stdout.split(),
                  key=lambda t: tuple(int(x) for x in re.findall(r"\d+", t)))
    pattern = "|".join(sorted(keys, key=len, reverse=True))
    first: dict[str, str] = {}
    for tag in tags:
        found = subprocess.run([*git, "grep", "-o", "-h", "-w", "-E", pattern, tag, "--", *PATHS],
                               capture_output=True, text=True).stdout.split()
        for word in set(found):
            first.setdefault(word, ".".join(re.findall(r"\d+", tag)))
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mirror", default=MIRROR)
    args = parser.parse_args()
    fields = {f.name: f for cls in (DecoderConfig, ParallelDecoderConfig) for f in dataclasses.fields(cls)}
    first = first_releases(list(fields), args.mirror)
    for name, f in fields.items():
        mark = "" if first.get(name) == f.metadata["since"] else f"  (config says {f.metadata['since']})"
        print(f"{name}: {first.get(name, 'not found')}{mark}")


if __name__ == "__main__":
    main()
