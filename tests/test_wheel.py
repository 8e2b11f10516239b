"""What users install: the sdist and the wheel built from it hold every module of the tree, and the wheel,
installed into a clean venv (no editable install, no network), resolves every model family's and data
processor's code that this tree registers, trains fc_mnist and a Llama-family params file and converts a
Hugging Face model.

Every earlier test ran an editable checkout, which hid a hand-kept package list that lacked
``cs_run.models.mpt``: the installed cs-run could not build any model. This test builds from a copy of the
source tree (as a fresh clone would), so nothing of this checkout's build state can stand in for the wheel's.
The clean venv sees this environment's dependencies (torch, h5py, ...) through one path line, and not the
editable cs-run: a path line in a ``.pth`` file does not run that folder's own ``.pth`` files.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "model_dir", "build", "dist", "*.egg-info", "__pycache__",
                                     ".pytest_cache", ".ruff_cache", ".hypothesis", "compile_dir", "cerebras_logs")


def _run(args: list, cwd: Path, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            env={**_clean_env(), **(env or {})}, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"{args} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CS_RUN_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _tree_modules() -> dict[str, str]:
    """Every module of the mapped folders: its path inside the installed ``cs_run`` namespace -> its source path."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    mapping = dict((p.strip() for p in line.split("=", 1))
                   for line in config["options"]["package_dir"].strip().splitlines())
    modules = {}
    for package, folder in mapping.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                inside = path.relative_to(ROOT / folder).as_posix()
                modules[package.replace(".", "/") + "/" + inside] = f"{folder}/{inside}"
    return modules


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The sdist of a copy of the source tree, and the wheel pip builds from that sdist (as from an index)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE)
    dist = tmp / "dist"
    dist.mkdir()
    _run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(dist)!r})"], cwd=src)
    (sdist,) = dist.glob("*.tar.gz")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dist, sdist], cwd=tmp)
    (wheel,) = dist.glob("*.whl")
    return {"src": src, "sdist": sdist, "wheel": wheel}


def test_the_sdist_and_the_wheel_hold_every_module_of_the_tree(built):
    expected = _tree_modules()
    assert len(expected) > 200 and "cs_run/models/mpt/hf.py" in expected
    in_wheel = set(zipfile.ZipFile(built["wheel"]).namelist())
    assert [m for m in expected if m not in in_wheel] == []
    assert {"cs_run/examples/fc_mnist/params.yaml", "cs_run/examples/gpt2/params.yaml"} <= in_wheel
    with tarfile.open(built["sdist"]) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        in_sdist = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert [source for source in expected.values() if source not in in_sdist] == [], f"missing from {top}"


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory) -> Path:
    """A clean venv with the wheel installed (no dependencies resolved, no index), its bin folder returned."""
    venv = tmp_path_factory.mktemp("venv") / "v"
    _run([sys.executable, "-m", "venv", venv], cwd=venv.parent)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", built["wheel"]], cwd=venv.parent)
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=venv.parent)
    dependencies = "\n".join(site.getsitepackages())
    (Path(purelib.stdout.strip()) / "dependencies_of_the_test_environment.pth").write_text(dependencies + "\n")
    where = _run([python, "-c", "import cs_run, cs_run.models.mpt; print(cs_run.__file__)"], cwd=venv.parent)
    assert where.stdout.strip().startswith(str(venv)), f"cs_run imported from {where.stdout.strip()}, not the wheel"
    return venv / "bin"


# Every registered model's code (each ``module:attr`` its spec names, its HF converter module) and every
# registered data processor, imported and resolved; prints the names, one JSON object.
_RESOLVE_ALL = textwrap.dedent("""
    import dataclasses, importlib, json
    from cs_run import registry
    models = {}
    for name in registry.registered_models():
        spec = registry.get_model_spec(name)
        for field in ("model_fn", "defaults_fn", "config_class", "builder", "parallelize", "data_fn"):
            value = getattr(spec, field)
            if value and ":" in value:
                registry.resolve_object(value, key=f"{name}.{field}")
        if spec.hf_converter:
            importlib.import_module(spec.hf_converter)
        models[name] = sorted(f.name for f in dataclasses.fields(spec) if getattr(spec, f.name))
    processors = registry.registered_data_processors()
    for name in processors:
        registry.data_processor_function(name, "wheel test")
    print(json.dumps({"models": models, "processors": processors}))
""")


def test_the_installed_wheel_resolves_every_family_and_data_processor_the_tree_registers(installed):
    """A family or processor whose module, data file or import the wheel lacks fails here by name (the
    module list alone, as ``wheel-check`` reads it, does not import anything)."""
    tree = json.loads(_run([sys.executable, "-c", _RESOLVE_ALL], cwd=ROOT).stdout)
    wheel = json.loads(_run([installed / "python", "-c", _RESOLVE_ALL], cwd=installed).stdout)
    assert len(tree["models"]) >= 30 and len(tree["processors"]) >= 19, tree  # 30 and 19 on 2026-11-28
    assert wheel == tree


def test_the_installed_wheel_trains_fc_mnist(installed, built, tmp_path):
    result = _run([installed / "cs-run", "train", "--params", built["src"] / "examples/fc_mnist/params.yaml",
                   "--model_dir", tmp_path / "fc", "--max_steps", "2", "--set", "runconfig.checkpoint_steps=2"], cwd=tmp_path)
    assert (tmp_path / "fc" / "checkpoint_2.mdl").is_file(), result.stdout + result.stderr


def test_the_installed_wheel_preprocesses_and_trains_a_llama_params_file(installed, tmp_path):
    text = tmp_path / "corpus"
    text.mkdir()
    for i in range(8):
        (text / f"doc{i}.txt").write_text(" ".join(f"word{(i * 7 + j) % 50} and more text {j}" for j in range(200)))
    _run([installed / "cs-run", "data", "preprocess", text, "-o", tmp_path / "shards", "--max_seq_length", "32",
          "--vocab_size", "300", "--files_per_record", "64"], cwd=tmp_path)
    params = {
        "train_input": {"data_processor": "GptHDF5DataProcessor", "data_dir": str(tmp_path / "shards" / "train"),
                        "batch_size": 2, "shuffle": False},
        "model": {"name": "llama", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 1, "num_heads": 4,
                  "filter_size": 64, "max_position_embeddings": 32, "position_embedding_type": "rotary",
                  "norm_type": "rmsnorm", "nonlinearity": "swiglu", "share_embedding_weights": False},
        "optimizer": {"optimizer_type": "AdamW", "learning_rate": 1e-3},
        "runconfig": {"max_steps": 2, "checkpoint_steps": 2, "seed": 1},
    }
    (tmp_path / "llama.yaml").write_text(yaml.safe_dump(params))
    _run([installed / "cs-run", "train", "--params", tmp_path / "llama.yaml", "--model_dir", tmp_path / "llama"],
         cwd=tmp_path)
    assert (tmp_path / "llama" / "checkpoint_2.mdl").is_file()


def test_the_installed_wheel_converts_a_hugging_face_model(installed, tmp_path):
    make_hf = textwrap.dedent(f"""
        import torch, transformers
        torch.manual_seed(0)
        config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        transformers.LlamaForCausalLM(config).save_pretrained({str(tmp_path / "hf")!r})
    """)
    _run([sys.executable, "-c", make_hf], cwd=tmp_path)
    _run([installed / "cs-run", "checkpoint", "convert", "--from", "hf", tmp_path / "hf", tmp_path / "llama.mdl"],
         cwd=tmp_path)
    info = _run([installed / "cs-run", "checkpoint", "info", tmp_path / "llama.mdl"], cwd=tmp_path)
    assert "model.embedding_layer.word_embeddings.weight" in info.stdout, info.stdout
