"""GPT-2 test helpers: shards written the Model Zoo's way, a tiny GPT-2 params file, and a run of it
through the runners (the CPU-vs-CSX comparisons of gpt2 and of every decoder family use it).

``write_vendor_shards`` follows the Model Zoo's hdf5_preprocessing writer (Release 1.9
``hdf5_base_preprocessor.write_hdf5_file`` and ``utils.create_features_auto_lm``), not cs-run's own
writer: one int32 dataset ``data`` of [n_examples, 3, msl] per file (rows input_ids, input_mask,
labels), chunks of one sample, gzip, and the ``n_examples`` attribute.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import torch
import yaml

from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner
from cs_run.summaries import read_scalars


def vendor_features(tokens: list[int], msl: int, pad_id: int = 0) -> np.ndarray:
    """One sample from msl + 1 tokens (or fewer, padded): inputs, mask, next-token labels."""
    input_ids, labels = tokens[:-1], tokens[1:]
    mask = [1] * len(input_ids)
    pad = msl - len(input_ids)
    return np.stack([np.int32(input_ids + [pad_id] * pad), np.int32(mask + [0] * pad),
                     np.int32(labels + [pad_id] * pad)])


def write_vendor_shards(folder: Path, samples: list[np.ndarray], per_file: int, name: str = "examples") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    msl = samples[0].shape[-1]
    paths = []
    for start_number, i in enumerate(range(0, len(samples), per_file)):
        part = samples[i:i + per_file]
        path = folder / f"{name}_{start_number}.h5"
        with h5py.File(path, mode="w") as f:
            f.attrs["n_examples"] = len(part)
            f.create_dataset("data", data=np.stack(part), dtype="i4", chunks=(1, 3, msl), compression="gzip")
        paths.append(path)
    return paths


def random_samples(n: int, msl: int, vocab: int, seed: int = 0) -> list[np.ndarray]:
    """Learnable token streams (each sample counts up from a random start, mod vocab), some padded."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        start = int(rng.integers(vocab))
        length = msl + 1 if i % 4 else int(rng.integers(3, msl + 1))
        out.append(vendor_features([(start + j) % vocab for j in range(length)], msl))
    return out


def tiny_shards(root: Path) -> Path:
    """``root/train`` (96 samples in 5 files) and ``root/val`` (16 in 2) for :data:`TINY_MODEL` (vocab 64,
    sequence 16); returns ``root``."""
    write_vendor_shards(root / "train", random_samples(96, 16, 64), per_file=20)
    write_vendor_shards(root / "val", random_samples(16, 16, 64, seed=1), per_file=8)
    return root


TINY_MODEL = dict(name="gpt2", vocab_size=64, hidden_size=32, num_hidden_layers=2, num_heads=4, filter_size=64,
                  max_position_embeddings=16, dropout_rate=0.1, attention_type="scaled_dot_product")


def tiny_params(path: Path, train_dir: Path, eval_dir: Path, model: dict | None = None, optimizer: dict | None = None,
                runconfig: dict | None = None, batch_size: int = 4) -> Path:
    params = {
        "train_input": {"data_processor": "GptHDF5DataProcessor", "data_dir": str(train_dir),
                        "batch_size": batch_size, "shuffle": True, "shuffle_seed": 7},
        "eval_input": {"data_processor": "GptHDF5DataProcessor", "data_dir": str(eval_dir),
                       "batch_size": batch_size, "shuffle": False},
        "model": {**TINY_MODEL, **(model or {})},
        "optimizer": optimizer or {"optimizer_type": "AdamW", "learning_rate": 1e-3, "max_gradient_norm": 1.0},
        "runconfig": {"max_steps": 20, "log_steps": 5, "seed": 1, "disable_progress_bar": True,
                      **(runconfig or {})},
    }
    path.write_text(yaml.safe_dump(params))
    return path


# Warmup from 0 then cosine, clipping, accumulation: the parts of a Model Zoo GPT optimizer block.
OPTIMIZER = {"optimizer_type": "AdamW", "grad_accum_steps": 2, "max_gradient_norm": 0.5, "weight_decay": 0.01,
             "learning_rate": [
                 {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 2e-3, "total_iters": 5},
                 {"scheduler": "CosineDecay", "initial_learning_rate": 2e-3, "end_learning_rate": 1e-4,
                  "total_iters": 15}]}


def run(tmp_path: Path, shards: Path, device: str, name: str, mode: str = "train_and_eval", model: dict | None = None,
        runconfig: dict | None = None, optimizer: dict | None = None) -> tuple[PyTorchBaseRunner, dict]:
    """``tiny_params`` over ``shards/train`` and ``shards/val`` (model_dir ``tmp_path/name``, optimizer
    :data:`OPTIMIZER` unless given) run in ``mode`` on ``device``: (the runner, its results)."""
    path = tiny_params(tmp_path / f"{name}.yaml", shards / "train", shards / "val", model=model,
                       optimizer=optimizer or OPTIMIZER, runconfig={"model_dir": str(tmp_path / name), **(runconfig or {})})
    runner = PyTorchBaseRunner.create(load_params(path), device=device)
    results = runner.run(mode)
    return runner, results


def weights(runner: PyTorchBaseRunner) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in runner.model.state_dict().items()}


def train_losses(runner: PyTorchBaseRunner) -> list[tuple[int, float]]:
    """(step, loss) of every log step, as the run wrote them to model_dir/train/scalars.csv."""
    return read_scalars(Path(runner.params.runconfig.model_dir) / "train")["loss"]


WORDS = "the quick brown fox jumps over the lazy dog while the cat sleeps".split()


def write_corpus(root: Path, documents: int = 8, words: int = 200) -> Path:
    """``root/doc<i>.txt``: seeded text from :data:`WORDS`, the input the preprocess tests tokenize."""
    rng = np.random.default_rng(0)
    for i in range(documents):
        (root / f"doc{i}.txt").write_text(" ".join(rng.choice(WORDS, words)) + "\n")
    return root
