"""sharding: fsdp's model build on 2 replicas (gloo, CPU, one process group, no training): replica 1 builds on the
meta device and its shards, buffers (non-persistent too), the build's metrics (in the model and outside it) and
random streams end as replica 0's, which are one process's whole build with the same seed, bit for bit; a model
whose ``__init__`` cannot run on meta (a table: ``.item()``, a data-dependent shape, a tensor kept outside the
parameters and buffers, a tensor made off the meta device) is built whole by every replica, with one warning on
replica 0 naming why, and ends the same. The accumulation run of test_fsdp_runs trains a meta-built replica."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.tensor import DTensor

from cs_run.metrics.accuracy import AccuracyMetric
from cs_run.metrics.mean import MeanMetric
from cs_run.metrics.metric import MetricSet, discarded_registrations
from cs_run.parallel.fsdp import FullyShardedStrategy
from cs_run.params import params_from_dict
from cs_run.runners._build import ModelBuild

SEED = 7


class Model(nn.Module):
    """Tied embedding and head, two blocks (FSDP groups), a random parameter, a non-persistent and a persistent
    buffer, a metric held by the model."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.blocks = nn.ModuleList([nn.Linear(6, 6) for _ in range(2)])
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.embed.weight
        self.noise = nn.Parameter(torch.randn(5, 3))
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 6, 2).float() / 6)), persistent=False)
        self.register_buffer("steps", torch.full((), 3, dtype=torch.int64))
        self.accuracy = AccuracyMetric("meta_build_accuracy")


class Item(Model):
    def __init__(self) -> None:
        super().__init__()
        self.scale = float(self.noise.abs().max().item())


class DataDependent(Model):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("odd", torch.nonzero(torch.arange(4) % 2).flatten())


class KeptTensor(Model):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.arange(4.0)


class OffMeta(Model):
    def __init__(self) -> None:
        super().__init__()
        self.fixed = nn.Parameter(torch.ones(3, device="cpu"))


def _with_outside_metric(cls: type) -> nn.Module:
    MeanMetric("meta_build_mean")  # registered while the model is built: the run's, though no module holds it
    return cls()


# case: (model class, None when replica 1 builds on meta, else the reason replica 0's one warning names)
CASES = {
    "meta": (Model, None),
    "item": (Item, "RuntimeError: Tensor.item() cannot be called on meta tensors"),
    "data-dependent": (DataDependent, "NotImplementedError: The register_meta function for torch.nonzero()"),
    "kept tensor": (KeptTensor, "module 'KeptTensor' keeps tensor 'table' outside its parameters and buffers"),
    "off meta": (OffMeta, "'fixed' was made off the meta device"),
}


def _seed() -> None:
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    random.seed(SEED)


def _draws() -> tuple:
    """The next numbers of every stream a run draws from after its build."""
    return torch.rand(4), np.random.rand(2), random.random()


def _outcome(model: nn.Module, metrics: MetricSet) -> dict:
    state = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
             for k, v in model.state_dict().items()}
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    held = {name: ({k: b.clone() for k, b in m._buffers.items()}, {k: v.clone() for k, v in m._initial_values.items()})
            for name, m in metrics.metrics().items()}
    return {"state": state, "buffers": buffers, "metrics": held, "draws": _draws()}


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _replica(rank: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    params = params_from_dict({"model": {"name": "meta_build"}})
    results = {}
    for case, (cls, _) in CASES.items():
        _seed()
        warned = _Warnings()
        logging.getLogger("cs_run.parallel.fsdp").addHandler(warned)
        metrics = MetricSet()
        strategy = FullyShardedStrategy()
        with metrics.collecting():
            model = strategy.build(ModelBuild(params, lambda _, cls=cls: _with_outside_metric(cls)), torch.device("cpu"))
        metrics.add_module(model)
        model = strategy.shard(model, torch.device("cpu"))
        logging.getLogger("cs_run.parallel.fsdp").removeHandler(warned)
        results[case] = {**_outcome(model, metrics), "warnings": warned.lines}
    torch.save(results, f"{out}/{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    root = tmp_path_factory.mktemp("meta_build")
    mp.start_processes(_replica, args=(str(root / "init"), str(root)), nprocs=2, start_method="spawn")
    return [torch.load(root / f"{rank}.pt", weights_only=False) for rank in range(2)]


@pytest.mark.parametrize("case", list(CASES))
def test_replica_1_ends_with_one_processs_whole_build(replicas, case):
    cls, why = CASES[case]
    _seed()
    metrics = MetricSet()
    with discarded_registrations(), metrics.collecting():
        model = _with_outside_metric(cls)
    metrics.add_module(model)
    reference = _outcome(model, metrics)
    for rank, results in enumerate(replicas):
        got = results[case]
        for part in ("state", "buffers"):  # bit for bit: the same values, copied
            assert got[part].keys() == reference[part].keys(), (rank, part)
            for key, value in reference[part].items():
                assert torch.equal(got[part][key], value), (rank, part, key)
        assert got["metrics"].keys() == reference["metrics"].keys() == {"meta_build_mean", "meta_build_accuracy"}
        for name, (buffers, initial) in reference["metrics"].items():
            assert {k: v.tolist() for k, v in got["metrics"][name][0].items()} == {k: v.tolist() for k, v in buffers.items()}
            assert {k: v.tolist() for k, v in got["metrics"][name][1].items()} == {k: v.tolist() for k, v in initial.items()}
        draws = got["draws"]  # the streams continue where one process's build left them
        assert torch.equal(draws[0], reference["draws"][0]) and np.array_equal(draws[1], reference["draws"][1])
        assert draws[2] == reference["draws"][2], rank
    assert replicas[1][case]["warnings"] == []
    warnings = replicas[0][case]["warnings"]
    if why is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and f"replica 1 cannot build the model on the meta device ({why}" in warnings[0], warnings
        assert warnings[0].endswith("every replica builds the whole model before sharding it")
