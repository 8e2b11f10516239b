"""The runner with runconfig.num_workers_per_csx = 2: each sample once per epoch, exact resume (replayed
or through the workers' restartable state), the data position in the checkpoint."""

from __future__ import annotations

import importlib

import pytest
import torch

from cs_run import checkpoint
from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner
from cs_run.runners._checkpoint_files import list_checkpoints

STREAM_DATA = '''
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

from cs_run import distributed
from cs_run.utils.data import DistributedSampler

SEEN = []


def tensors(num_samples):
    g = torch.Generator().manual_seed(0)
    return torch.randn(num_samples, 6, generator=g), torch.randint(0, 3, (num_samples,), generator=g)


def sharded(split, batch_size=4, num_samples=64, **_):
    """Each stream: every num_streamers-th sample from its rank on, shuffled."""
    x, y = tensors(num_samples)
    rank, streams = distributed.get_streaming_rank(), distributed.num_streamers()
    mine = Subset(TensorDataset(x, y, torch.arange(num_samples)), list(range(rank, num_samples, streams)))
    return DataLoader(mine, batch_size=distributed.get_streaming_batch_size(batch_size), shuffle=split == "train",
                      drop_last=True)


def sharded_eval(split, batch_size=8, num_samples=32, **_):
    x, y = tensors(num_samples)
    rank, streams = distributed.get_streaming_rank(), distributed.num_streamers()
    mine = Subset(TensorDataset(x, y), list(range(rank, num_samples, streams)))
    return DataLoader(mine, batch_size=distributed.get_streaming_batch_size(batch_size))


class Restartable(DataLoader):
    def __init__(self, batch_size, num_samples):
        x, y = tensors(num_samples)
        super().__init__(TensorDataset(x, y, torch.arange(num_samples)),
                         batch_sampler=DistributedSampler(range(num_samples), seed=5, batch_size=batch_size))
        self.previous = 0

    def state_dict(self):
        return {"samples_streamed": distributed.get_worker_state().samples_streamed, "previous": self.previous}

    def aggregate_state_dict(self, worker_states):
        return {"samples_streamed": worker_states[0]["previous"] + sum(s["samples_streamed"] for s in worker_states)}

    def deaggregate_state_dict(self, aggregated_state_dict, strict=True):
        return aggregated_state_dict

    def load_state_dict(self, state_dict, strict=True):
        self.previous = state_dict["samples_streamed"]
        self.batch_sampler.set_state(state_dict["samples_streamed"])


def restartable(split, batch_size=4, num_samples=64, **_):
    return Restartable(batch_size, num_samples)
'''


class Recorder:
    """Records the sample ids of every train batch (its third tensor) and trains on the other two."""

    def __init__(self, runner):
        self.ids = []
        inner = runner._train_step

        def step(micro_batches):
            self.ids += [b[2].tolist() for b in micro_batches]
            return inner([b[:2] for b in micro_batches])

        runner._train_step = step


@pytest.fixture
def stream_project(toy_project):
    (toy_project.parent / "stream_data.py").write_text(STREAM_DATA)
    importlib.invalidate_caches()
    return toy_project


def make_runner(params_path, data_fn, model_dir, workers=2, **overrides):
    params = load_params(params_path, {"train_input.data_fn": f"stream_data:{data_fn}",
                                       "runconfig.model_dir": str(model_dir), "runconfig.num_workers_per_csx": workers,
                                       "eval_input.data_fn": "stream_data:sharded_eval", **overrides})
    runner = PyTorchBaseRunner.create(params, device="CPU")
    return runner, Recorder(runner)


def weights(runner):
    return {k: v.clone() for k, v in runner.model.state_dict().items()}


def test_two_workers_train_each_sample_once_per_epoch(stream_project, tmp_path):
    runner, seen = make_runner(stream_project, "sharded", tmp_path / "md", **{"runconfig.max_steps": 32})
    runner.run("train")
    assert len(seen.ids) == 32  # 2 epochs of 64 samples in batches of 4
    for epoch in (seen.ids[:16], seen.ids[16:]):
        # worker w streams the samples of its parity; the replica takes batches from workers 0, 1, 0, ...
        assert [sorted({s % 2 for s in b}) for b in epoch] == [[j % 2] for j in range(16)]
        assert sorted(s for b in epoch for s in b) == list(range(64))
    assert seen.ids[:16] != seen.ids[16:]  # the second epoch is reshuffled


@pytest.mark.parametrize("data_fn, workers", [("sharded", 2), ("restartable", 2), ("restartable", 1)])
def test_resume_is_bit_identical(stream_project, tmp_path, data_fn, workers):
    whole, whole_seen = make_runner(stream_project, data_fn, tmp_path / "whole", workers, **{"runconfig.max_steps": 23})
    whole.run("train")
    split_seen = []
    for max_steps in (7, 23):  # 7 of 16 steps of the first epoch, then across the epoch boundary
        split, seen = make_runner(stream_project, data_fn, tmp_path / "split", workers,
                                  **{"runconfig.max_steps": max_steps})
        split.run("train")
        split_seen += seen.ids
    assert split_seen == whole_seen.ids
    for key, value in weights(whole).items():
        torch.testing.assert_close(weights(split)[key], value, rtol=0, atol=0)
    data = checkpoint.load(str(list_checkpoints(tmp_path / "split")[0][1]))["dataloader"]
    assert (data["num_csx"], data["num_workers_per_csx"], data["epoch_step"]) == (1, workers, 7)
    if data_fn == "restartable":  # the workers' aggregated state: 7 steps x 4 samples
        assert data["workers"] == {"samples_streamed": 28}
    else:
        assert "workers" not in data


@pytest.mark.parametrize("legs", [((5, 2), (9, 3), (12, 1)), ((5, 1), (12, 2))])
def test_restartable_resume_with_another_worker_count_is_exact(stream_project, tmp_path, legs):
    whole, whole_seen = make_runner(stream_project, "restartable", tmp_path / "whole", **{"runconfig.max_steps": 12})
    whole.run("train")
    seen = []
    for max_steps, workers in legs:
        runner, recorder = make_runner(stream_project, "restartable", tmp_path / "split", workers,
                                       **{"runconfig.max_steps": max_steps})
        runner.run("train")
        seen += recorder.ids
    assert seen == whole_seen.ids


def test_a_replayed_resume_in_another_topology_warns(stream_project, tmp_path, caplog):
    make_runner(stream_project, "sharded", tmp_path / "md", 2, **{"runconfig.max_steps": 3})[0].run("train")
    resumed, seen = make_runner(stream_project, "sharded", tmp_path / "md", 1, **{"runconfig.max_steps": 6})
    with caplog.at_level("WARNING", logger="cs_run"):
        resumed.run("train")
    assert len(seen.ids) == 3 and "written with num_csx=1 x num_workers_per_csx=2" in caplog.text


def test_eval_with_two_workers_covers_the_eval_set_once(stream_project, tmp_path, caplog):
    # The eval data shards by streaming rank: 2 workers see each of the 32 samples once, so the eval loss
    # (the mean of equal-sized batch means) is the single-stream one up to the summation order.
    losses = {}
    for workers in (1, 2):  # the same seed: the same initial weights
        runner, _ = make_runner(stream_project, "sharded", tmp_path / f"w{workers}", workers)
        caplog.clear()
        with caplog.at_level("INFO", logger="cs_run"):
            losses[workers] = runner.run("eval")["eval/loss"]
        assert "Batches=4," in caplog.text  # 32 samples in batches of 8, with one stream or two
    assert losses[2] == pytest.approx(losses[1], rel=1e-6)
