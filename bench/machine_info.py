"""What a benchmark prints about the machine it ran on (one copy for the bench scripts, which import it by name:
a script's own folder is first on sys.path)."""

from __future__ import annotations

import subprocess

__all__ = ["cpu_name"]


def cpu_name() -> str:
    """The CPU's model name as lscpu says it, so that a row's numbers name the machine; "unknown CPU" where
    lscpu is missing or names no model."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                "unknown CPU")
