"""Shared, seeded fixtures: a tiny MLP and a synthetic classification loader (Lightning's BoringModel).

Torch is pinned to one thread: results stay deterministic and two-core CI hosts do not thrash.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
import torch

# The suite is the CPU suite: its CSX tests compare against CPU references bit for bit. On a GPU machine
# the GPU stays hidden (from the subprocesses too) unless CS_RUN_TEST_CUDA=1, which is how the tests
# marked `cuda` run: `CS_RUN_TEST_CUDA=1 pytest -m cuda`. Set before torch first initialises CUDA.
_TEST_CUDA = os.environ.get("CS_RUN_TEST_CUDA") == "1"
if not _TEST_CUDA:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

# The suite never writes the user's compile cache (~/.cache/cs-run): the whole session, its subprocesses
# too, points it at a temporary folder, and each test gets its own (_own_compile_cache) so no test hits a
# compile an earlier one made.
os.environ["CS_RUN_CACHE_DIR"] = tempfile.mkdtemp(prefix="cs_run_test_cache_")
atexit.register(shutil.rmtree, os.environ["CS_RUN_CACHE_DIR"], True)

from cs_run import distributed  # noqa: E402  (after the GPU is hidden)
from cs_run.engine import compile as engine_compile  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _own_compile_cache(monkeypatch, tmp_path_factory):
    """Each test's default compile cache is a fresh folder of its own (see CS_RUN_CACHE_DIR above)."""
    monkeypatch.setenv("CS_RUN_CACHE_DIR", str(tmp_path_factory.mktemp("compile_cache")))


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` run only with CS_RUN_TEST_CUDA=1 on a machine with a CUDA device."""
    if _TEST_CUDA and torch.cuda.is_available():
        return
    why = ("needs a CUDA device" if _TEST_CUDA else
           "needs a CUDA GPU and CS_RUN_TEST_CUDA=1 (the default suite hides the GPU; see tests/conftest.py)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(autouse=True)
def _csx_default_tier_fx(monkeypatch):
    """CSX steps in the suite default to the fx tier (bit-identical, builds instantly) instead of the
    product default ``auto``, which builds inductor too (seconds per step function); tests of auto and
    inductor name their tier."""
    monkeypatch.setattr(engine_compile, "DEFAULT_TIER", "fx")


@pytest.fixture(autouse=True)
def _one_input_worker(monkeypatch):
    """A backend or runner with num_workers_per_csx > 1 sets the process's input workers; no test leaks
    that setting into the next."""
    monkeypatch.setattr(distributed, "_WORKERS_PER_CSX", 1)


class TinyMLP(torch.nn.Module):
    """Two linear layers with a BatchNorm, so tests see parameters *and* buffers."""

    def __init__(self, in_features: int = 8, hidden: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(in_features, hidden)
        self.bn = torch.nn.BatchNorm1d(hidden)
        self.fc2 = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def make_batches(n: int = 8, batch_size: int = 4, in_features: int = 8, classes: int = 4, seed: int = 0):
    """A deterministic list of (inputs, labels) batches."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch_size, in_features, generator=g), torch.randint(0, classes, (batch_size,), generator=g))
        for _ in range(n)
    ]


@pytest.fixture
def tiny_mlp() -> TinyMLP:
    torch.manual_seed(0)
    return TinyMLP()


@pytest.fixture
def batches():
    return make_batches()


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "model_dir"
    path.mkdir()
    return path


TOY_MODULE = '''
"""A user project as a user writes it: model and data functions, a custom runner."""
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import cs_run
from cs_run.runners import PyTorchCSRunner, PyTorchRunner


class Toy(torch.nn.Module):
    def __init__(self, hidden, dropout):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(6, hidden), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                                       torch.nn.Linear(hidden, 3))

    def forward(self, batch):
        x, y = batch
        return F.cross_entropy(self.net(x), y)


def build_model(hidden: int = 8, dropout: float = 0.0):
    return Toy(hidden, dropout)


def make_tensors(split, num_samples, nan_at=-1):
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    x = torch.randn(num_samples, 6, generator=g)
    y = torch.randint(0, 3, (num_samples,), generator=g)
    if nan_at >= 0:
        x[nan_at] = float("nan")
    return x, y


def build_data(split, batch_size=4, shuffle=True, drop_last_batch=True, num_samples: int = 64, nan_at: int = -1):
    x, y = make_tensors(split, num_samples, nan_at)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle and split == "train",
                      drop_last=drop_last_batch)


CALLS = []


class Recording:
    """Records every hook call; mixed into a CPU and a CSX runner."""

    def on_train_start(self):
        CALLS.append("on_train_start"); super().on_train_start()

    def on_train_end(self, early_exit):
        CALLS.append("on_train_end"); super().on_train_end(early_exit)

    def on_eval_start(self):
        CALLS.append("on_eval_start"); super().on_eval_start()

    def on_eval_end(self, early_exit):
        CALLS.append("on_eval_end"); super().on_eval_end(early_exit)

    def on_train_epoch_start(self):
        CALLS.append("on_train_epoch_start"); super().on_train_epoch_start()

    def on_train_epoch_end(self, early_exit):
        CALLS.append(f"on_train_epoch_end(early_exit={early_exit})"); super().on_train_epoch_end(early_exit)

    def on_eval_epoch_start(self):
        CALLS.append("on_eval_epoch_start"); super().on_eval_epoch_start()

    def on_eval_epoch_end(self, early_exit):
        CALLS.append("on_eval_epoch_end"); super().on_eval_epoch_end(early_exit)

    def on_train_batch_start(self, data):
        CALLS.append("on_train_batch_start"); return super().on_train_batch_start(data)

    def on_train_batch_end(self, loss, epoch=None, step=None):
        CALLS.append(f"on_train_batch_end({step})"); super().on_train_batch_end(loss, epoch, step)

    def on_eval_batch_start(self, data):
        CALLS.append("on_eval_batch_start"); return super().on_eval_batch_start(data)

    def on_eval_batch_end(self, loss, epoch=None, step=None):
        CALLS.append(f"on_eval_batch_end({step})"); super().on_eval_batch_end(loss, epoch, step)

    def on_checkpoint_saved(self, path, step):
        CALLS.append(f"on_checkpoint_saved({step})"); super().on_checkpoint_saved(path, step)


class RecordingRunner(Recording, PyTorchRunner):
    pass


class RecordingCSRunner(Recording, PyTorchCSRunner):
    pass


class NotARunner:
    pass


class MyOptimizer(cs_run.optim.Optimizer):
    """A custom compliant optimizer written as the vendor's custom optimizer guide describes (plain SGD with a decay)."""

    def __init__(self, params, lr=0.1, decay=0.0):
        super().__init__(params, {"lr": lr, "decay": decay}, enable_global_step=False)

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["velocity"] = cs_run.zeros_like(p)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                v = self.state[p]["velocity"]
                v.mul_(group["decay"]).add_(p.grad)
                p.sub_(v * group["lr"])

    def state_names_to_sparsify(self):
        return ["velocity"]


class BranchyModel(torch.nn.Module):
    """Not trace-compliant: branches on a tensor value in forward."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, batch):
        x, y = batch
        if x.sum() > 0:  # COMPLIANCE-LINE
            x = x * 2
        return F.cross_entropy(self.fc(x), y)


def build_branchy_model():
    return BranchyModel()
'''

TOY_PARAMS = """
train_input:
  data_fn: "toy_models:build_data"
  batch_size: 4
  shuffle: true
  num_samples: 64
eval_input:
  data_fn: "toy_models:build_data"
  batch_size: 8
  shuffle: false
  num_samples: 32
model:
  name: "toy_models:build_model"
  hidden: 8
  dropout: 0.1
optimizer:
  optimizer_type: "SGD"
  learning_rate: 0.1
  momentum: 0.9
runconfig:
  max_steps: 20
  log_steps: 5
  checkpoint_steps: 10
  seed: 3
  disable_progress_bar: true
"""


@pytest.fixture(autouse=True)
def _data_parallel_after():
    """A test that made a strategy current itself (``parallel.use``) leaves data parallel current, as a run
    does: a later CSX compile on the same worker is never refused by a sharded strategy."""
    from cs_run import parallel

    yield
    parallel.use(parallel.Strategy())


@pytest.fixture(autouse=True)
def _fresh_backend():
    """One backend type per process (vendor rule): every test starts and ends without one, and with the
    process's mixed-precision settings (``cstorch.amp``'s, which a run with mixed precision sets) as it found
    them: a data function reads them (the image dtype), so a test must not see an earlier test's."""
    from cs_run.amp import state as amp_state
    from cs_run.backend import _reset_for_tests

    saved = dict(amp_state._state)
    with _reset_for_tests():
        try:
            yield
        finally:
            amp_state._state.clear()
            amp_state._state.update(saved)


@pytest.fixture
def toy_project(tmp_path, monkeypatch):
    """A folder with a user module (toy_models.py) on sys.path and its params.yaml; returns the yaml path."""
    import sys

    (tmp_path / "toy_models.py").write_text(TOY_MODULE)
    params = tmp_path / "params.yaml"
    params.write_text(TOY_PARAMS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("toy_models", None)
    yield params
    sys.modules.pop("toy_models", None)
