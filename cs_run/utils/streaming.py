"""A replica's input workers (``num_workers_per_csx > 1``) and the restartable-loader protocol.

:class:`StreamingLoader` runs W input workers on torch's DataLoader worker processes. Each worker calls the
``input_fn`` in its own process with its own streaming rank (``ordinal * W + worker``) and yields whole
per-replica batches; the replica takes them in turn (torch's round-robin order: batch ``j`` of a pass comes
from worker ``j % W`` while every worker still has batches). One pass of the StreamingLoader is one pass of
every worker's loader, so a data function that shards by streaming rank sees each sample once per epoch.

Exact resume follows the vendor's :class:`RestartableDataLoader` protocol: after every batch a worker asks
its loader for ``state_dict()`` (with :func:`cs_run.distributed.get_worker_state` describing the worker);
the replica keeps each worker's newest state, ``aggregate_state_dict`` turns the ``N x W`` states into the
one the checkpoint holds, and on resume each new worker loads ``deaggregate_state_dict(saved)``. See
docs/architecture.md#streaming-workers for the rules, and what is exact when the topology changes.
"""

from __future__ import annotations

import copy
import inspect
import logging
import random
import signal
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

import numpy as np
import torch

from cs_run import distributed, replicas
from cs_run.batches import batch_size
from cs_run.distributed import DataLoaderCheckpoint
from cs_run.errors import CsRunError, TrainingError

__all__ = ["RestartableDataLoader", "StreamingLoader", "aggregate_states", "gather_states", "load_state",
           "replica_state", "worker_state_dict"]

logger = logging.getLogger(__name__)


@runtime_checkable
class RestartableDataLoader(Protocol):
    """A dataloader that saves and restores its position (the vendor's protocol).

    * ``state_dict()``: this worker's state, called in the worker (``cstorch.distributed.get_worker_state()``
      tells it who it is and how far it got);
    * ``aggregate_state_dict(worker_states)``: the list of every worker's state, in streaming-rank order,
      to the one state the checkpoint holds;
    * ``deaggregate_state_dict(aggregated_state_dict, strict=True)``: the saved state to this worker's;
    * ``load_state_dict(state_dict, strict=True)``: resume there (called before the loader is iterated).

    ``strict`` is optional, but either both of the last two methods take it or neither (the vendor's rule).
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None: ...

    def aggregate_state_dict(self, worker_states: list[dict[str, Any]]) -> dict[str, Any]: ...

    def deaggregate_state_dict(self, aggregated_state_dict: dict[str, Any], strict: bool = True) -> dict[str, Any]: ...


def _strict_kwargs(loader: Any, strict: bool) -> dict[str, bool]:
    """``{"strict": strict}`` when the loader's load/deaggregate methods take it, else ``{}``.

    Raises:
        TypeError: one of the two takes ``strict`` and the other does not (the vendor's rule).
    """
    takes = ["strict" in inspect.signature(m).parameters
             for m in (loader.load_state_dict, loader.deaggregate_state_dict)]
    if any(takes) and not all(takes):
        raise TypeError(f"{type(loader).__name__}: either both or none of load_state_dict and deaggregate_state_dict "
                        "must take the `strict` argument")
    return {"strict": strict} if all(takes) else {}


def load_state(loader: Any, aggregated: dict[str, Any], strict: bool = True) -> None:
    """Resume ``loader`` (one worker's) from a saved aggregated state: ``load_state_dict(deaggregate(...))``."""
    kwargs = _strict_kwargs(loader, strict)
    loader.load_state_dict(loader.deaggregate_state_dict(aggregated, **kwargs), **kwargs)


def worker_state_dict(loader: Any, info: DataLoaderCheckpoint) -> DataLoaderCheckpoint:
    """``info`` with the loader's own ``state_dict()`` filled in, called while ``get_worker_state()`` returns
    ``info`` (deep-copied, so later batches do not change it)."""
    with distributed._worker_state(info):
        user_state = copy.deepcopy(loader.state_dict())
    return replace(info, user_state_dict=user_state)


def aggregate_states(loader: Any, states: list[DataLoaderCheckpoint]) -> dict[str, Any]:
    """The loader's ``aggregate_state_dict`` over the workers' own states, in streaming-rank order."""
    ordered = sorted(states, key=lambda s: s.global_worker_id)
    return copy.deepcopy(loader.aggregate_state_dict([s.user_state_dict for s in ordered]))


def gather_states(states: list[DataLoaderCheckpoint]) -> list[DataLoaderCheckpoint]:
    """Every replica's worker states, given this replica's: a collective when the job has several
    replicas (every replica calls it at the same step)."""
    if replicas.joined() and distributed.get_world_size() > 1:
        gathered: list[Any] = [None] * distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, states)
        return [s for part in gathered for s in part]
    return states


def replica_state(loader: Any, steps: int, batches: int, samples: int) -> dict[str, Any]:
    """The aggregated state of a job whose replicas stream themselves (``num_workers_per_csx = 1``): each
    replica's loader has given ``batches`` batches of ``samples`` samples in ``steps`` steps since it
    started (or was loaded). A collective with several replicas."""
    info = DataLoaderCheckpoint(local_worker_id=0, num_workers_per_csx=1, num_csx=distributed.get_world_size(),
                                wse_id=distributed.get_ordinal(), appliance_step=steps, worker_step=batches,
                                samples_streamed=samples)
    return aggregate_states(loader, gather_states([worker_state_dict(loader, info)]))


def _as_worker_loader(loader: Any) -> Any:
    """A torch DataLoader runs in the input worker itself: its own worker processes (a worker process
    cannot start more) and pinned memory (the replica pins, if anything) are turned off, as the vendor's
    user node does; a ``worker_init_fn`` is called once with id 0, as the vendor's is."""
    if isinstance(loader, torch.utils.data.DataLoader):
        if loader.num_workers > 0 and loader.worker_init_fn is not None:
            loader.worker_init_fn(0)
        loader.num_workers = 0
        loader.pin_memory = False
    return loader


@dataclass
class _Failure:
    """A cs-run error raised in a worker, sent back as a value so the replica raises it with its one line."""

    kind: type
    message: str


class _WorkerSource(torch.utils.data.IterableDataset):
    """What each torch worker process iterates: builds its loader with the ``input_fn`` as input worker
    ``info.id``, loads its share of the saved state and yields ``(worker, batch, state after the batch)``."""

    def __init__(self, build: Callable[[], Any], workers: int, replica: tuple[int, int],
                 state: dict[str, Any] | None, strict: bool, epoch: int) -> None:
        self.build, self.workers, self.replica = build, workers, replica
        self.state, self.strict, self.epoch = state, strict, epoch

    def __iter__(self) -> Iterator[tuple[int, Any, DataLoaderCheckpoint | None]]:
        info = torch.utils.data.get_worker_info()
        worker = info.id if info is not None else 0
        if info is not None:  # a Ctrl-C is the replica's to handle (it may want a batch after it); SIGTERM stops
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker (torch terminates stuck workers with it)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with distributed.streaming_worker(worker, self.workers, self.replica):
            try:
                loader = _as_worker_loader(self.build())
                restartable = isinstance(loader, RestartableDataLoader)
                if self.state is not None and restartable:
                    load_state(loader, self.state, self.strict)
                if not restartable:
                    _start_epoch(loader, self.epoch)
            except CsRunError as e:
                yield worker, _Failure(type(e), str(e)), None
                return
            counters = _counters(worker, self.workers, self.replica)
            for batch in loader:
                counters = replace(counters, worker_step=counters.worker_step + 1,
                                   appliance_step=counters.worker_step * self.workers + worker + 1,
                                   samples_streamed=counters.samples_streamed + batch_size(batch))
                yield worker, batch, worker_state_dict(loader, counters) if restartable else None


def _counters(worker: int, workers: int, replica: tuple[int, int]) -> DataLoaderCheckpoint:
    return DataLoaderCheckpoint(local_worker_id=worker, num_workers_per_csx=workers, num_csx=replica[1],
                                wse_id=replica[0], appliance_step=0, worker_step=0, samples_streamed=0)


def _start_epoch(loader: Any, epoch: int) -> None:
    """A worker builds its (non-restartable) loader afresh each epoch, so what would carry over from one
    pass to the next in a single process is set from the epoch instead: the sampler's or batch sampler's
    ``set_epoch(epoch)`` (torch's and cs-run's DistributedSampler), and a loader's own ``generator`` is
    seeded ``initial_seed + epoch``."""
    if not epoch:
        return
    for part in (getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)):
        if callable(getattr(part, "set_epoch", None)):
            part.set_epoch(epoch)
    generator = getattr(loader, "generator", None)
    if isinstance(generator, torch.Generator):
        generator.manual_seed(generator.initial_seed() + epoch)


class _PreservedRandomness:
    """Runs a block without moving the replica's torch / numpy / random streams (building a copy of a
    worker's loader in the replica must not change what the training step draws)."""

    def __enter__(self) -> None:
        self._torch = torch.get_rng_state()
        self._numpy = np.random.get_state()
        self._random = random.getstate()

    def __exit__(self, *exc: Any) -> None:
        torch.set_rng_state(self._torch)
        np.random.set_state(self._numpy)
        random.setstate(self._random)


class StreamingLoader:
    """A replica's batches from ``workers`` input worker processes, each calling ``build`` (the ``input_fn``)
    with its own streaming rank. Iterating it is one epoch: one pass over every worker's loader, the
    batches taken in turn (worker ``j % W`` gives the pass's batch ``j`` while all have batches left).

    Workers start at each pass (torch's non-persistent workers), seeded from the replica's torch RNG as
    torch seeds its workers, so a pass is a function of the replica's RNG state when it starts and of
    :meth:`set_epoch`. A loader following :class:`RestartableDataLoader` starts each pass where the previous
    one stopped (its aggregated state is handed over), and :meth:`state_dict` / :meth:`load_state_dict`
    carry that position through a checkpoint.

    Args:
        build: Called with no arguments in each worker process (and, to learn the epoch length and a
            worker's first state, in the replica under that worker's streaming rank; never iterated there).
        workers: W, the input workers of this replica (>= 1; 1 also runs one worker process).
        timeout: Seconds to wait for a worker's next batch before the pass fails (0: no limit), so a stuck
            data function cannot hang the replica.
    """

    def __init__(self, build: Callable[[], Any], workers: int, timeout: float = 0) -> None:
        if not callable(build):
            raise TypeError(f"StreamingLoader expects a callable returning a dataloader, got {type(build).__name__}")
        self.build, self.workers, self.timeout = build, distributed._check_workers(workers), timeout
        self.epoch = 0
        self._strict = True
        self._next_start: dict[str, Any] | None = None  # the aggregated state the next pass starts from
        self._pass_start: dict[str, Any] | None = None  # the one the current (or last) pass started from
        self._latest: list[DataLoaderCheckpoint | None] = [None] * self.workers  # newest state per worker
        self._streamed = False  # a pass started since the last load
        self._running = False
        self._fresh: list[Any] | None = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass is (a non-restartable loader that owns a ``generator`` is re-seeded
        ``initial_seed + epoch`` in its workers, since they build it afresh every epoch)."""
        self.epoch = int(epoch)

    # ------------------------------------------------------------------------ the replica's copies

    def _copy_of_worker(self, worker: int, state: dict[str, Any] | None = None) -> Any:
        """Worker ``worker``'s loader built here, with ``state`` loaded (never iterated)."""
        with distributed.streaming_worker(worker, self.workers, _replica()), _PreservedRandomness():
            loader = _as_worker_loader(self.build())
            if state is not None and isinstance(loader, RestartableDataLoader):
                load_state(loader, state, self._strict)
        return loader

    def _fresh_copies(self) -> list[Any]:
        if self._fresh is None:
            self._fresh = [self._copy_of_worker(w) for w in range(self.workers)]
        return self._fresh

    @property
    def is_restartable(self) -> bool:
        """True when the input_fn's loader follows :class:`RestartableDataLoader`."""
        return isinstance(self._fresh_copies()[0], RestartableDataLoader)

    @property
    def batch_size(self) -> int | None:
        return getattr(self._fresh_copies()[0], "batch_size", None)

    def __len__(self) -> int:
        """Batches in one epoch: the sum of the workers' loader lengths (each built fresh)."""
        try:
            return sum(len(loader) for loader in self._fresh_copies())
        except TypeError:
            raise TypeError("the input_fn's dataloader has no length") from None

    # ------------------------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        """One epoch. The workers start here, not at the first batch: they are seeded from the replica's
        torch RNG as it is when the epoch's iterator is made (as torch's DataLoader does)."""
        if self._running:
            raise RuntimeError("a StreamingLoader runs one pass at a time; finish (or close) the previous one first")
        restartable = self.is_restartable
        if restartable and self._streamed:  # hand the position over to this pass's workers
            self._next_start = aggregate_states(self._fresh_copies()[0], self._worker_states())
        self._pass_start, self._latest, self._streamed = self._next_start, [None] * self.workers, True
        source = _WorkerSource(self.build, self.workers, _replica(), self._pass_start, self._strict,
                               0 if restartable else self.epoch)
        pin = torch.cuda.is_available() and bool(getattr(self._fresh_copies()[0], "pin_memory", False))
        with warnings.catch_warnings():  # W is the user's choice, also above the core count
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            loader = torch.utils.data.DataLoader(source, batch_size=None, num_workers=self.workers, pin_memory=pin,
                                                 timeout=self.timeout)
            batches = iter(loader)
        self.epoch += 1
        return self._take(batches)

    def _take(self, batches: Iterator[Any]) -> Iterator[Any]:
        self._running = True
        try:
            while True:
                try:
                    worker, batch, state = next(batches)
                except StopIteration:
                    return
                except RuntimeError as e:
                    if "exited unexpectedly" in str(e):
                        raise TrainingError(f"an input worker of replica {distributed.get_ordinal()} died ({e}); its "
                                            "data function crashed the process (look for a fatal error above, or the "
                                            "system killed it for memory)") from None
                    if "timed out" in str(e):
                        raise TrainingError(f"an input worker of replica {distributed.get_ordinal()} gave no batch in "
                                            f"{self.timeout:g} s; its data function is stuck") from None
                    raise
                if isinstance(batch, _Failure):
                    raise batch.kind(batch.message)
                self._latest[worker] = state
                yield batch
        finally:
            self._running = False

    # ------------------------------------------------------------------------------------ position

    def _worker_states(self) -> list[DataLoaderCheckpoint]:
        """This replica's workers' states now: after each one's newest batch of the current (or last) pass;
        a worker that has given none yet is where the pass started (asked of a copy of its loader)."""
        start = self._pass_start if self._streamed else self._next_start
        latest = self._latest if self._streamed else [None] * self.workers
        return [state if state is not None else
                worker_state_dict(self._copy_of_worker(w, start), _counters(w, self.workers, _replica()))
                for w, state in enumerate(latest)]

    def state_dict(self) -> dict[str, Any]:
        """The aggregated state of all ``num_csx x W`` workers: the loader's ``aggregate_state_dict`` over
        their states in streaming-rank order. With several replicas every replica must call it at the same
        step: it gathers the other replicas' worker states (a collective).

        Raises:
            RuntimeError: the input_fn's loader is not a :class:`RestartableDataLoader`.
        """
        if not self.is_restartable:
            raise RuntimeError("DataLoader is not configured for getting state. Please implement the "
                               "RestartableDataLoader interface (state_dict, load_state_dict, aggregate_state_dict, "
                               "deaggregate_state_dict) to enable `state_dict()` and `load_state_dict()`")
        return aggregate_states(self._fresh_copies()[0], gather_states(self._worker_states()))

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Start the next pass from ``state_dict`` (an aggregated state): each worker loads its
        ``deaggregate_state_dict`` share.

        Raises:
            RuntimeError: the loader is not restartable, or a pass is running.
        """
        if not self.is_restartable:
            raise RuntimeError("DataLoader is not configured for setting state. Please implement the "
                               "RestartableDataLoader interface to enable `state_dict()` and `load_state_dict()`")
        if self._running:
            raise RuntimeError("DataLoader state can only be loaded before iterating; load_state_dict() was "
                               "called during a pass")
        self._strict = strict
        self._copy_of_worker(0, state_dict)  # a state the loader rejects fails here, in the replica
        self._next_start, self._streamed = copy.deepcopy(state_dict), False


def _replica() -> tuple[int, int]:
    return distributed.get_ordinal(), distributed.get_world_size()
