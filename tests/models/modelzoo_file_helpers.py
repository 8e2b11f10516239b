"""What the tests of the Model Zoo's own params files share: tools/modelzoo_files.py (``mz``), a vendor file read
from the local mirror of github:Cerebras/modelzoo and shrunk by it (sizes, batch, steps and data paths only), its
runs in one process with every step's loss, and the CLI calls that must succeed."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cs_run._yaml import parse as parse_yaml
from cs_run.frontends.cli import cli as main_cli
from cs_run.summaries import read_scalars

TOOL = Path(__file__).resolve().parents[2] / "tools" / "modelzoo_files.py"
_spec = importlib.util.spec_from_file_location("modelzoo_files", TOOL)
mz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mz)
TAG = "Release_2.10.0"
needs_mirror = pytest.mark.skipif(not Path(mz.MIRROR).exists(), reason="no local Model Zoo mirror")
# where a trainer's loaders are (validate's and validate_all's may be YAML aliases of fit's val_dataloader)
LOADERS = (("fit", "train_dataloader"), ("fit", "val_dataloader"), ("validate", "val_dataloader"),
           ("validate_all", "val_dataloaders"))


def shrunk(path: str, data: Path, tmp_path: Path, tag: str = TAG) -> dict:
    """The vendor file at ``path`` (under the repository root) of ``tag``, shrunk over ``data``."""
    text = subprocess.run(["git", f"--git-dir={mz.MIRROR}", "show", f"{tag}:{path}"], check=True,
                          capture_output=True, text=True).stdout
    raw, _ = parse_yaml(text, path)
    return mz.shrink(raw, data, tmp_path / "model_dir")


def loaders(params: dict):
    """Each loader section of the params' trainer."""
    trainer = params["trainer"]
    for part, key in LOADERS:
        section = trainer.get(part, {}).get(key)
        if isinstance(section, dict):
            yield section


def in_process(params: dict) -> dict:
    """``params`` with no loader worker processes (a 2-core test machine; the same batches)."""
    for section in loaders(params):
        section["num_workers"] = 0
    return params


def in_process_every_step(params: dict) -> dict:
    """:func:`in_process`, and every step's loss logged (a step count)."""
    in_process(params)["trainer"]["init"].setdefault("logging", {})["log_steps"] = 1
    return params


def write(params: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def cli(*args) -> str:
    """``cs-run ARGS``' output; the run must succeed."""
    result = CliRunner().invoke(main_cli, [*map(str, args)])
    assert result.exit_code == 0, result.output
    return result.output


def train_on_cpu_and_csx(path: Path, tmp_path: Path) -> tuple[list, list]:
    """validate-only, then training on CPU and on CSX's fx tier: the two runs' (step, loss) lists."""
    cli("validate-only", "--params", path, "--model_dir", tmp_path / "v")
    cli("train", "--params", path, "--model_dir", tmp_path / "cpu", "--device", "CPU")
    cli("train", "--params", path, "--model_dir", tmp_path / "csx", "--device", "CSX", "--compile_tier", "fx")
    cpu, csx = (read_scalars(tmp_path / d / "train")["loss"] for d in ("cpu", "csx"))
    return cpu, csx


def train_flat_file_3_cpu_steps(params: dict, path: Path, run_dir: Path) -> list:
    """A shrunk flat file of Release 2.2/2.3 (train_input, eval_input, runconfig) in process, each step logged:
    validate-only, then 3 CPU steps; their (step, loss) list."""
    for section in (params["train_input"], params["eval_input"]):
        section["num_workers"] = 0
    params["runconfig"].update(max_steps=3, log_steps=1)
    write(params, path)
    cli("validate-only", "--params", path, "--model_dir", run_dir / "v")
    cli("train", "--params", path, "--model_dir", run_dir / "cpu", "--device", "CPU")
    return read_scalars(run_dir / "cpu" / "train")["loss"]


def run_file(path: str, data: Path, out: Path, command: str, device: str) -> dict:
    """tools/modelzoo_files.py's run of the vendor file at ``path`` (of TAG) in this process, CSX on the fx tier:
    its result row."""
    args = mz.default_args(out=str(out), shards=str(data), command=command, device=device,
                           compile_tier="fx" if device == "CSX" else None, in_process=True)
    return mz.run_one(path, TAG, args)
