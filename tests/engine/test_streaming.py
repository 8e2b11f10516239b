"""Input workers (num_workers_per_csx > 1): sharding, the vendor's restartable-loader protocol, exact resume.

Each StreamingLoader pass starts W worker processes (fork), so the passes here are few and tiny.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import pytest
import torch

import cs_run as cstorch
from cs_run import distributed
from cs_run.errors import ParamsError, TrainingError
from cs_run.utils.data import DataLoader, DistributedSampler
from cs_run.utils.streaming import StreamingLoader

N_SAMPLES = 24


def sharded_input_fn(batch_size: int = 2):
    """Each stream takes the samples ``rank, rank + S, ...`` (S streamers) and shuffles them with its RNG."""
    data = torch.utils.data.TensorDataset(torch.arange(N_SAMPLES))
    rank, streams = distributed.get_streaming_rank(), distributed.num_streamers()
    mine = torch.utils.data.Subset(data, list(range(rank, N_SAMPLES, streams)))
    return torch.utils.data.DataLoader(mine, batch_size=batch_size, shuffle=True)


class SamplesStreamed(torch.utils.data.DataLoader):
    """The Model Zoo's restartable loader, as its rule reads: each worker saves the samples it streamed,
    the aggregate is their sum (plus what earlier runs streamed), and every worker resumes its
    DistributedSampler at that global position."""

    def __init__(self, global_batch: int, num_samples: int = 22, seed: int = 7):
        sampler = DistributedSampler(range(num_samples), shuffle=True, seed=seed, batch_size=global_batch)
        super().__init__(torch.utils.data.TensorDataset(torch.arange(num_samples)), batch_sampler=sampler)
        self.previous = 0

    def state_dict(self):
        info = distributed.get_worker_state()
        return {"samples_streamed": info.samples_streamed, "previous": self.previous}

    def aggregate_state_dict(self, worker_states):
        return {"samples_streamed": worker_states[0]["previous"] + sum(s["samples_streamed"] for s in worker_states)}

    def deaggregate_state_dict(self, aggregated_state_dict, strict=True):
        return aggregated_state_dict

    def load_state_dict(self, state_dict, strict=True):
        self.previous = state_dict["samples_streamed"]
        self.batch_sampler.set_state(state_dict["samples_streamed"])


def values(batches):
    return [b[0].tolist() for b in batches]


def test_two_workers_see_each_sample_once_per_epoch_in_turn():
    torch.manual_seed(0)
    loader = StreamingLoader(sharded_input_fn, 2)
    assert len(loader) == 12  # 6 batches of 2 per worker
    for _ in range(2):  # two epochs, each one pass of both workers
        batches = values(loader)
        # The hand-built expectation: worker w streams the samples w, w + 2, ... and batch j comes from
        # worker j % 2, so every sample of batch j has the parity j % 2; together: each sample once.
        assert [sorted({s % 2 for s in b}) for b in batches] == [[j % 2] for j in range(12)]
        assert sorted(s for b in batches for s in b) == list(range(N_SAMPLES))


def test_replica_of_two_streams_its_own_share(monkeypatch):
    # Replica 1 of 2 (as a launcher sets it), 2 workers: streaming ranks 2 and 3 of 4.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    batches = values(StreamingLoader(sharded_input_fn, 2))
    assert [sorted({s % 4 for s in b}) for b in batches] == [[2 + j % 2] for j in range(6)]
    assert sorted(s for b in batches for s in b) == [s for s in range(N_SAMPLES) if s % 4 in (2, 3)]


def test_same_batches_for_the_same_seed_and_different_epochs():
    torch.manual_seed(1)
    first = StreamingLoader(sharded_input_fn, 2)
    a = [values(first), values(first)]
    torch.manual_seed(1)
    b = [values(StreamingLoader(sharded_input_fn, 2)) for _ in range(1)]
    assert a[0] == b[0] and a[0] != a[1]  # a pass is a function of the RNG when it starts


def global_batches(num_samples, batch, seed, count):
    """The vendor's global order by hand: epoch e is randperm(seed + e), epochs follow each other (samples
    left over at an epoch end start the next global batch), cut into global batches."""
    stream = []
    epoch = 0
    while len(stream) < count * batch:
        stream += torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        epoch += 1
    return [stream[i * batch:(i + 1) * batch] for i in range(count)]


def run_stream(workers, global_batch, steps, state=None):
    """``steps`` batches of a replica with ``workers`` workers (new passes as needed); returns (batches, state)."""
    loader = StreamingLoader(lambda: SamplesStreamed(global_batch), workers)
    if state is not None:
        loader.load_state_dict(state)
    out = []
    while len(out) < steps:
        for batch in loader:
            out.append(batch[0].tolist())
            if len(out) == steps:
                break
    return out, loader.state_dict()


def test_restartable_resume_is_bit_identical_and_topology_independent():
    expected = global_batches(22, 4, 7, 9)
    whole, _ = run_stream(2, 4, 9)
    assert whole == expected  # 2 epochs (5 batches, 2 samples carried into the second)
    head, state = run_stream(2, 4, 4)
    assert state == {"samples_streamed": 16}
    for workers in (2, 3, 1):  # resumed with 2 workers, and with a different number of workers
        tail, _ = run_stream(workers, 4, 5, state)
        assert head + tail == expected, workers


def test_protocol_round_trip_follows_the_vendors_rule():
    seen = []

    class Recording(torch.utils.data.DataLoader):
        def state_dict(self):
            info = distributed.get_worker_state()
            return {"rank": distributed.get_streaming_rank(), "id": info.global_worker_id, "step": info.worker_step,
                    "samples": info.samples_streamed, "loaded": getattr(self, "loaded", None)}

        def aggregate_state_dict(self, worker_states):
            return {"workers": worker_states}

        def deaggregate_state_dict(self, aggregated_state_dict, strict=True):
            return {"mine": aggregated_state_dict["workers"][distributed.get_streaming_rank()], "strict": strict}

        def load_state_dict(self, state_dict, strict=True):
            self.loaded = state_dict["mine"]["step"]
            seen.append((distributed.get_streaming_rank(), state_dict["strict"], strict))

    def input_fn():
        rank = distributed.get_streaming_rank()
        return Recording(torch.utils.data.TensorDataset(torch.arange(30)[rank::3]), batch_size=2)

    loader = StreamingLoader(input_fn, 3)
    it = iter(loader)
    for _ in range(7):
        next(it)
    state = loader.state_dict()
    it.close()
    # The vendor's count: after k replica steps worker w has streamed k // W + (w < k % W) batches.
    steps = [7 // 3 + (w < 7 % 3) for w in range(3)]
    assert state == {"workers": [{"rank": w, "id": w, "step": steps[w], "samples": 2 * steps[w], "loaded": None}
                                 for w in range(3)]}
    resumed = StreamingLoader(input_fn, 3)
    resumed.load_state_dict(state, strict=False)
    assert seen == [(0, False, False)]  # checked once in the replica, on worker 0's copy
    # Before the resumed run streams, each worker is where its deaggregated share put it.
    assert [w["loaded"] for w in resumed.state_dict()["workers"]] == steps


def test_strict_in_one_method_only_is_refused():
    class Half(SamplesStreamed):
        def deaggregate_state_dict(self, aggregated_state_dict):
            return aggregated_state_dict

    loader = DataLoader(lambda: Half(4))
    with pytest.raises(TypeError, match="both or none"):
        loader.load_state_dict({"samples_streamed": 0})


def test_cstorch_dataloader_with_two_workers_resumes_through_its_state(monkeypatch):
    cstorch.backend("CPU", cluster_config={"num_workers_per_csx": 2})
    assert distributed.num_streamers() == 2 and not distributed.is_streamer()
    with pytest.raises(RuntimeError, match="inside the input_fn"):
        distributed.get_streaming_rank()
    loader = DataLoader(SamplesStreamed, 4)
    expected = global_batches(22, 4, 7, 6)
    executor = cstorch.utils.data.DataExecutor(loader, num_steps=3, checkpoint_steps=3)
    got = []
    for batch in executor:
        got.append(batch[0].tolist())
    state = loader.state_dict()  # the final step is a checkpoint step
    resumed = DataLoader(SamplesStreamed, 4)
    resumed.load_state_dict(state)
    got += [b[0].tolist() for b in cstorch.utils.data.DataExecutor(resumed, num_steps=3)]
    assert got == expected


def test_get_worker_state_only_inside_state_dict():
    with pytest.raises(RuntimeError, match="inside your dataloader's implementation"):
        distributed.get_worker_state()


def test_a_params_error_in_a_worker_is_raised_with_its_one_line():
    def input_fn():
        raise ParamsError("params: train_input.data_dir: no such folder")

    loader = StreamingLoader(input_fn, 2)
    with pytest.raises(ParamsError, match=r"^params: train_input.data_dir: no such folder$"):
        len(loader)  # the replica's copy raises first, before any worker starts


VENDOR = json.loads((Path(__file__).parents[1] / "data" / "vendor_oracle" / "sampler.json").read_text())


@pytest.mark.parametrize("case", VENDOR["cases"], ids=lambda c: "{num_csx}x{workers} n={num_samples} B={batch_size} "
                                                                "start={start_index}".format(**c))
def test_distributed_sampler_matches_the_vendors_streams(case, monkeypatch):
    def passes():
        sampler = DistributedSampler(list(range(case["num_samples"])), shuffle=case["shuffle"], seed=VENDOR["seed"],
                                     start_index=case["start_index"], batch_size=case["batch_size"])
        return [[list(b) for b in sampler] for _ in range(3)]

    n, w = case["num_csx"], case["workers"]
    for rank, expected in enumerate(case["streams"]):
        with distributed.streaming_worker(rank % w, w, (rank // w, n)):
            assert passes() == expected, rank
    distributed.set_num_workers_per_csx(2)  # a replica with input workers does not stream: whole global batches
    assert not distributed.is_streamer() and passes() == case["user_node"]


def test_worker_batch_count_is_the_vendors():
    # After k replica steps with W workers, worker w has given k // W + (w < k % W) batches (the vendor's
    # DataLoaderCheckpointer count), which is what get_worker_state().worker_step says in a StreamingLoader.
    for key, count in VENDOR["worker_iterations"].items():
        steps, workers, worker = map(int, key.split(","))
        assert steps // workers + (worker < steps % workers) == count
    loader = StreamingLoader(lambda: SamplesStreamed(2), 3)
    it = iter(loader)
    for _ in range(5):
        next(it)
    assert [s.worker_step for s in loader._worker_states()] == [VENDOR["worker_iterations"][f"5,3,{w}"]
                                                               for w in range(3)]
    it.close()


def _replica_of_two(rank, folder):
    """One of two replicas (gloo): 3 steps from 2 input workers, then the gathered state."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    try:
        loader = StreamingLoader(lambda: SamplesStreamed(8, num_samples=64), 2)
        it = iter(loader)
        batches = [next(it)[0].tolist() for _ in range(3)]
        state = loader.state_dict()  # a collective: both replicas call it
        it.close()
        (Path(folder) / f"replica{rank}.json").write_text(json.dumps({"batches": batches, "state": state}))
    finally:
        torch.distributed.destroy_process_group()


def test_two_replicas_gather_their_workers_state_and_resume_on_one(tmp_path):
    torch.multiprocessing.start_processes(_replica_of_two, args=(str(tmp_path),), nprocs=2, start_method="fork")
    runs = [json.loads((tmp_path / f"replica{r}.json").read_text()) for r in range(2)]
    expected = global_batches(64, 8, 7, 5)
    # Each replica streams its half of every global batch; together they are the global batches in order.
    assert [a + b for a, b in zip(runs[0]["batches"], runs[1]["batches"])] == expected[:3]
    assert runs[0]["state"] == runs[1]["state"] == {"samples_streamed": 24}  # 2 replicas x 2 workers, summed
    # 2 x 2 streams resumed by 1 replica x 3 workers: the next global batches, whole.
    resumed = StreamingLoader(lambda: SamplesStreamed(8, num_samples=64), 3)
    resumed.load_state_dict(runs[0]["state"])
    assert [b[0].tolist() for b in itertools.islice(resumed, 2)] == expected[3:]


def test_a_dead_worker_ends_the_pass_with_one_error_at_once():
    def input_fn():
        if torch.utils.data.get_worker_info() is not None and distributed.get_streaming_rank() == 1:
            os._exit(3)  # a crash of the process, not a Python error
        return torch.utils.data.DataLoader(torch.arange(8), batch_size=2)

    with pytest.raises(TrainingError, match=r"an input worker of replica 0 died \(DataLoader worker \(pid"):
        list(StreamingLoader(input_fn, 2))


def test_a_stuck_worker_fails_the_pass_after_the_timeout():
    def input_fn():
        if torch.utils.data.get_worker_info() is not None and distributed.get_streaming_rank() == 1:
            time.sleep(60)
        return torch.utils.data.DataLoader(torch.arange(8), batch_size=2)

    start = time.monotonic()
    with pytest.raises(TrainingError, match="gave no batch in 1 s; its data function is stuck"):
        list(StreamingLoader(input_fn, 2, timeout=1))
    assert time.monotonic() - start < 30
