"""Data streaming: ``DataLoader(input_fn)``, ``DataExecutor``, ``compute_num_steps``, ``SyntheticDataset``.

Each streaming worker calls the ``input_fn`` to build its own torch DataLoader: the replica process itself
with ``num_workers_per_csx = 1``, else each of its W input worker processes
(:class:`cs_run.utils.streaming.StreamingLoader`). Shard the data in the ``input_fn`` with
:func:`cs_run.distributed.get_streaming_rank` / ``num_streamers`` (or :class:`DistributedSampler`, which
does it in an order independent of the topology). Batches are moved to the backend's device with
``non_blocking=True`` (no host sync; pin memory in the input_fn for truly asynchronous copies to CUDA).
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from cs_run import distributed, replicas
from cs_run._torch_compat import pytree
from cs_run.backend import current_backend
from cs_run.batches import RateMeter, batch_size, cycle, loader_length, move_to_device
from cs_run.distributed import DataLoaderCheckpoint
from cs_run.engine import closures
from cs_run.errors import ParamsError
from cs_run.interrupts import Interrupted, StopFlag, stop_on_signal
from cs_run.schedule import is_checkpoint_step, is_final_step, step_budget
from cs_run.utils.streaming import RestartableDataLoader, StreamingLoader, load_state, replica_state

__all__ = ["DataLoader", "DataLoaderCheckpoint", "DataExecutor", "DistributedSampler", "Profiler",
           "RestartableDataLoader", "Schedule", "SyntheticDataset", "compute_num_steps", "current_executor"]

logger = logging.getLogger(__name__)


def current_executor() -> DataExecutor | None:
    """The DataExecutor being iterated, or None."""
    return closures.current_loop()


def compute_num_steps(dataloader: Any = None, initial_step: int = 0, num_steps: int | None = None,
                      max_steps: int | None = None, num_epochs: int | None = None,
                      steps_per_epoch: int | None = None, grad_accum_steps: int = 1) -> int:
    """Steps to run from the vendor's step options: the vendor-named face of :func:`cs_run.schedule.step_budget`.

    The smallest of ``num_epochs x steps_per_epoch``, ``num_steps`` and ``max_steps - initial_step``
    (``num_steps`` and ``num_epochs`` are mutually exclusive); ``steps_per_epoch`` counts batches, at
    most ``len(dataloader)``, and an epoch is ``steps_per_epoch // grad_accum_steps`` steps.

    Raises:
        ValueError: (a :class:`~cs_run.errors.ParamsError`) conflicting or invalid options, none of
            num_steps / num_epochs / max_steps, or ``initial_step`` already at ``max_steps``.
    """
    return step_budget(loader_batches=loader_length(dataloader), initial_step=initial_step, num_steps=num_steps,
                       max_steps=max_steps, num_epochs=num_epochs, steps_per_epoch=steps_per_epoch,
                       grad_accum_steps=grad_accum_steps).steps


class DataLoader:
    """Wraps an ``input_fn`` that returns a torch DataLoader (or any iterable of batches).

    With ``num_workers_per_csx = W > 1`` (the backend's cluster_config) the batches come from W input worker
    processes (:class:`~cs_run.utils.streaming.StreamingLoader`). :meth:`state_dict` / :meth:`load_state_dict`
    save and restore the position of a loader following :class:`RestartableDataLoader` (the vendor's rule).

    Args:
        input_fn: Called once per worker as ``input_fn(*args, **kwargs)``.
        num_steps, max_steps, num_epochs, steps_per_epoch: the older form (the vendor's cstorch porting guide): iterating yields
            exactly :func:`compute_num_steps` batches, cycling epochs. Without them one pass is one epoch.
    """

    def __init__(self, input_fn: Callable[..., Any], *args: Any, num_steps: int | None = None,
                 max_steps: int | None = None, num_epochs: int | None = None,
                 steps_per_epoch: int | None = None, **kwargs: Any) -> None:
        if not callable(input_fn):
            raise TypeError(f"DataLoader expects a callable input_fn returning a torch DataLoader, got "
                            f"{type(input_fn).__name__}")
        self.input_fn, self.args, self.kwargs = input_fn, args, kwargs
        self.step_options = dict(num_steps=num_steps, max_steps=max_steps, num_epochs=num_epochs,
                                 steps_per_epoch=steps_per_epoch)
        self._loader: Any = None

    @property
    def loader(self) -> Any:
        """The replica's dataloader (built on first use): the input_fn's, or with W > 1 input workers a
        :class:`~cs_run.utils.streaming.StreamingLoader` of W of them."""
        if self._loader is None:
            build = functools.partial(self.input_fn, *self.args, **self.kwargs)
            workers = distributed.num_workers_per_csx()
            self._loader = StreamingLoader(build, workers) if workers > 1 else build()
        return self._loader

    def state_dict(self) -> dict[str, Any]:
        """The position of all input workers for a checkpoint: the loader's ``aggregate_state_dict`` over the
        workers' ``state_dict()`` (the vendor's rule). Call it in a checkpoint closure; with several replicas
        every replica calls it (it gathers their workers' states) and ordinal 0 saves it.

        Raises:
            RuntimeError: the loader is not a :class:`RestartableDataLoader`, or a running DataExecutor is not
                on a checkpoint step.
        """
        executor = current_executor()
        if executor is not None and not executor.on_checkpoint_step:
            raise RuntimeError("DataLoader state can only be requested at a checkpoint step. Please ensure that "
                               "`state_dict` is called on the `cstorch.utils.data.DataLoader` at a checkpoint step, "
                               "e.g. inside a method decorated with `cstorch.checkpoint_closure`")
        if isinstance(self.loader, StreamingLoader):
            return self.loader.state_dict()
        self._check_restartable("getting")
        if executor is None:
            return replica_state(self.loader, 0, 0, 0)
        return replica_state(self.loader, executor.user_iteration, executor.user_iteration,
                             executor.profiler.total_samples)

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True) -> None:
        """Resume from a saved :meth:`state_dict`: each worker loads ``deaggregate_state_dict(state_dict)``.

        Raises:
            RuntimeError: the loader is not a :class:`RestartableDataLoader`, or a DataExecutor is iterating.
        """
        if current_executor() is not None:
            raise RuntimeError("DataLoader state can only be loaded before execution; call `load_state_dict()` "
                               "before iterating the DataExecutor")
        if isinstance(self.loader, StreamingLoader):
            self.loader.load_state_dict(state_dict, strict)
            return
        self._check_restartable("setting")
        load_state(self.loader, state_dict, strict)

    def _check_restartable(self, what: str) -> None:
        if not self.is_restartable:
            raise RuntimeError(f"DataLoader is not configured for {what} state. Please implement the "
                               "RestartableDataLoader interface (state_dict, load_state_dict, aggregate_state_dict, "
                               "deaggregate_state_dict) to enable `state_dict()` and `load_state_dict()`")

    @property
    def is_restartable(self) -> bool:
        """True when the input_fn's loader saves and restores its position (:class:`RestartableDataLoader`)."""
        if isinstance(self.loader, StreamingLoader):
            return self.loader.is_restartable
        return isinstance(self.loader, RestartableDataLoader)

    @property
    def batch_size(self) -> int | None:
        """The input_fn's loader's batch size (None when it has none)."""
        return getattr(self.loader, "batch_size", None)

    @property
    def num_steps(self) -> int | None:
        """Steps of the older form, or None when no step option was given."""
        if all(v is None for v in self.step_options.values()):
            return None
        return compute_num_steps(self.loader, **self.step_options)

    def __len__(self) -> int:
        n = self.num_steps
        if n is not None:
            return n
        length = loader_length(self.loader)
        if length is None:
            raise TypeError("the input_fn's dataloader has no length; pass num_steps")
        return length

    def __iter__(self) -> Iterator[Any]:
        n = self.num_steps
        it = self.cycle() if n is not None else iter(self.loader)
        for batch in itertools.islice(it, n):
            yield move_to_device(batch, _backend_device())

    def cycle(self) -> Iterator[Any]:
        """Batches forever, restarting the underlying loader at each epoch end (see :func:`cs_run.batches.cycle`)."""
        return cycle(self.loader)


def _backend_device() -> torch.device | None:
    be = current_backend(raise_exception=False, raise_warning=False)
    return be.torch_device if be is not None else None


class Profiler(RateMeter):
    """An executor's throughput: ``rate()`` (recent samples/s), ``global_rate()`` (methods, as the vendor's),
    ``total_samples``, ``total_time``."""

    def rate(self) -> float:  # type: ignore[override]
        return RateMeter.rate.fget(self)

    def global_rate(self) -> float:  # type: ignore[override]
        return RateMeter.global_rate.fget(self)


class DataExecutor:
    """Runs ``num_steps`` steps of a :class:`DataLoader`; knows the step number and checkpoint steps.

    Args:
        dataloader: A :class:`DataLoader` (or any iterable of batches).
        num_steps: Steps to run (default: the loader's steps, else one epoch). Epochs repeat as needed.
        checkpoint_steps: Checkpoint every this many steps (and on the final step); default: the
            backend's ``checkpoint_steps``; 0/None means only the final step.
    """

    def __init__(self, dataloader: Any, num_steps: int | None = None, checkpoint_steps: int | None = None,
                 activation_steps: int | None = None, profiler_activities: Any = None, writer: Any = None,
                 micro_batch_size: Any = None, cs_config: Any = None) -> None:
        if num_steps is None:
            num_steps = dataloader.num_steps if isinstance(dataloader, DataLoader) else None
            num_steps = num_steps or loader_length(dataloader)
        if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
            raise ParamsError(f"Invalid num_steps: {num_steps!r} (must be a positive integer)")
        if checkpoint_steps is None:
            be = current_backend(raise_exception=False, raise_warning=False)
            checkpoint_steps = be.checkpoint_steps if be is not None else None
        if checkpoint_steps is not None and (not isinstance(checkpoint_steps, int) or checkpoint_steps < 0):
            raise ParamsError(f"Invalid checkpoint_steps: {checkpoint_steps!r} (must be an integer >= 0)")
        self.dataloader, self.num_steps, self.checkpoint_steps = dataloader, num_steps, checkpoint_steps or 0
        self.activation_steps, self.writer, self.micro_batch_size = activation_steps or 1, writer, micro_batch_size
        self.profiler = Profiler()
        self.profiler_activities = list(profiler_activities or [])  # vendor profiler plug-ins: recorded only
        self.cs_config = cs_config  # the 2.0 cstorch.utils.CSConfig: recorded (the backend holds the cluster)
        self._iteration = -1
        self._stop = StopFlag()
        self._checkpointed = -1  # the last iteration told it is a checkpoint step

    def __len__(self) -> int:
        return self.num_steps

    @property
    def iteration(self) -> int:
        """0-based index of the current step."""
        return self._iteration

    @property
    def user_iteration(self) -> int:
        """1-based number of the current step (what logs and checkpoint names use)."""
        return self._iteration + 1

    @property
    def on_final_iteration(self) -> bool:
        """True on the last step (or once a signal asked the loop to stop)."""
        return self._stop.requested or is_final_step(self.user_iteration, self.num_steps)

    @property
    def steps_left(self) -> int:
        """Steps still to run, the current one included (what the CSX engine's tier auto weighs)."""
        return self.num_steps - max(self._iteration, 0)

    @property
    def on_checkpoint_step(self) -> bool:
        """True when weights may be fetched (see :func:`cs_run.schedule.is_checkpoint_step`), and once a
        signal asked the loop to stop (docs/architecture.md#interrupts)."""
        yes = self._stop.requested or is_checkpoint_step(self.user_iteration, self.num_steps, self.checkpoint_steps)
        if yes:
            self._checkpointed = self._iteration
        return yes

    def __iter__(self) -> Iterator[Any]:
        """The batches; on SIGINT / SIGTERM the loop ends after the first whole step whose checkpoint closures
        were told it is a checkpoint step (that step, or the next one), raising
        :class:`~cs_run.interrupts.Interrupted`."""
        source = cycle(self.dataloader.loader if isinstance(self.dataloader, DataLoader) else self.dataloader)
        device = _backend_device()
        with closures.running(self), stop_on_signal(replicas.stop_grace(), replicas.report_end) as self._stop:
            last = False
            for i, batch in enumerate(itertools.islice(source, self.num_steps)):
                self._iteration = i
                batch = move_to_device(batch, device)
                self.profiler.tick(batch_size(batch))
                yield batch
                if self._stop_agreed(i) and i + 1 < self.num_steps:
                    if self._checkpointed == i or last:
                        raise self._interrupted()
                    last = True  # the signal came after this step's checkpoint closures: one more step saves
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)  # one sync at the end so total_time covers the device work
            self.profiler.finish()


    def _stop_agreed(self, i: int) -> bool:
        """The stop request after step ``i``; with several replicas any replica's, and the step counts as
        checkpointed only if every replica's closures were told so (one tiny host collective per step), so
        all replicas save and stop after the same step."""
        if replicas.world_size() == 1:
            return self._stop.requested
        signum, unsaved = replicas.max_values(self._stop.signum or 0, float(self._checkpointed != i))
        if signum and not self._stop.requested:
            self._stop.signum = int(signum)
        if signum and unsaved:
            self._checkpointed = -1  # one more step, on every replica, saves
        return bool(signum)

    def _interrupted(self) -> Interrupted:
        step = self.user_iteration
        saved = f"the checkpoint closures of step {step} ran" if self._checkpointed == self._iteration else \
            "no checkpoint closure ran (save in a cstorch.checkpoint_closure to keep the work)"
        interrupted = Interrupted(self._stop.signum, step, None, saved)
        logger.warning("%s", interrupted)
        return interrupted


class SyntheticDataset(torch.utils.data.Dataset):
    """A dataset whose every sample is ``spec`` (a pytree of tensors, or callables ``f(index)``).

    Useful for validate/compile-only runs and benchmarks. ``num_samples`` is its length (required by
    torch samplers).
    """

    def __init__(self, sample_spec: Any, num_samples: int = 1024) -> None:
        spec = sample_spec
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"Invalid num_samples: {num_samples!r} (must be a positive integer)")
        leaves = pytree.tree_leaves(spec)
        if not leaves or not all(isinstance(x, torch.Tensor) or callable(x) for x in leaves):
            raise TypeError("SyntheticDataset spec must be a pytree of tensors or callables f(index) -> tensor")
        self.spec, self.num_samples = spec, num_samples

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < self.num_samples:
            raise IndexError(index)
        return pytree.tree_map(lambda x: x(index) if callable(x) else x, self.spec)
@dataclass
class Schedule:
    """A set of steps given as intervals (the vendor's ``Schedule``): ``step in schedule``."""

    @dataclass
    class Range:
        """Steps ``start, start + step, ...`` below ``end`` (and ``end - 1`` when ``include_last``)."""

        start: int
        end: int
        step: int
        include_last: bool = False

        def __contains__(self, value: int) -> bool:
            if not self.start <= value < self.end:
                return False
            return (value - self.start) % self.step == 0 or (self.include_last and value == self.end - 1)

    intervals: list

    def __contains__(self, value: int) -> bool:
        return any(value in interval for interval in self.intervals)


class DistributedSampler(torch.utils.data.Sampler):
    """Indices of ``data_source`` for this input stream, in an order independent of the topology (the
    vendor's sampler).

    The samples form one stream: epoch ``e`` is a permutation seeded ``seed + e`` (``shuffle``) or the
    natural order, and epochs follow each other; ``start_index`` (or :meth:`set_state`) is a position in
    that stream, the number of samples streamed before. With ``batch_size`` (the global batch) the stream is
    cut into global batches; global batch ``g`` (counted from the last :meth:`set_state`) goes to input worker
    ``g % W`` of every replica, and replica ``r`` takes its slice ``[r B/N, (r+1) B/N)``; the sampler yields those per-replica batches
    (use it as a DataLoader's ``batch_sampler``). One iteration is one pass: up to the last full batch of the
    current epoch, the samples left over starting the next pass (``drop_last``), or a last short batch
    (``drop_last=False``), padded from the epoch's start with ``pad_last``. Without ``batch_size`` it yields
    single indices, every streamer's ``rank::num_streamers`` share of the epoch.

    So a resume at ``start_index = samples streamed`` (the Model Zoo's restartable loader's rule) continues
    the same global order with any number of replicas and workers, as long as the global batch is the same.
    """

    def __init__(self, data_source: Any, shuffle: bool = True, seed: int | None = None, start_index: int = 0,
                 shard: bool = True, batch_size: int | None = None, drop_last: bool = True,
                 num_samples: int | None = None, pad_last: bool = False) -> None:
        if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                       or batch_size < 1):
            raise ValueError(f"Invalid batch_size {batch_size!r}: must be a positive integer (the global batch size)")
        self.data_source, self.shuffle, self.seed, self.shard = data_source, shuffle, seed, shard
        self.batch_size, self.drop_last, self.pad_last = batch_size, drop_last, pad_last
        self.num_samples = len(data_source) if num_samples is None else num_samples
        if not isinstance(self.num_samples, int) or self.num_samples < 1:
            raise ValueError(f"Invalid num_samples {self.num_samples!r}: must be a positive integer")
        self.set_state(start_index)

    def set_state(self, start_index: int) -> None:
        """Continue from ``start_index``, the samples streamed so far across all workers of all replicas."""
        if not isinstance(start_index, int) or start_index < 0:
            raise ValueError(f"Invalid start_index {start_index!r}: must be an integer >= 0")
        self.start_index = start_index
        self._first_group = 0  # the worker that takes the pass's first global batch

    def set_epoch(self, epoch: int) -> None:
        """Start the next pass at the beginning of ``epoch`` (torch's sampler method)."""
        self.set_state(epoch * self.num_samples)

    def _order(self, epoch: int) -> list[int]:
        size = len(self.data_source)
        if not self.shuffle:
            return [i % size for i in range(self.num_samples)]
        g = torch.Generator().manual_seed((self.seed or 0) + epoch)
        if self.num_samples <= size:
            return torch.randperm(size, generator=g)[:self.num_samples].tolist()
        repeats = torch.arange(size).repeat(math.ceil(self.num_samples / size))[:self.num_samples]
        return repeats[torch.randperm(self.num_samples, generator=g)].tolist()

    def _positions(self, start: int, end: int) -> list[int]:
        """Sample indices at stream positions ``[start, end)``."""
        out, epoch, orders = [], None, None
        for p in range(start, end):
            if p // self.num_samples != epoch:
                epoch = p // self.num_samples
                orders = self._order(epoch)
            out.append(orders[p % self.num_samples])
        return out

    def _topology(self) -> tuple[int, int, int, int]:
        """(replicas, workers per replica, this replica, this worker); the replica itself, when it is not a
        streamer, sees every global batch whole."""
        if not self.shard or not distributed.is_streamer():
            return 1, 1, 0, 0
        workers = distributed.num_workers_per_csx()
        rank = distributed.get_streaming_rank()
        return distributed.get_world_size(), workers, rank // workers, rank % workers

    def _pass(self) -> tuple[list[Any], int, int]:
        """This stream's share of the pass (per-replica batches, or single indices), where the pass ends and
        its number of global batches."""
        n, b, start = self.num_samples, self.batch_size, self.start_index
        replicas, workers, replica, worker = self._topology()
        if b is None:
            end = (start // n + 1) * n
            return self._positions(start, end)[replica * workers + worker::replicas * workers], end, 0
        if self.drop_last:
            end = ((start + b - 1) // n + 1) * n  # the end of the epoch the pass's first batch ends in
            end = start + (end - start) // b * b
            batches = [self._positions(p, p + b) for p in range(start, end, b)]
        else:
            end = (start // n + 1) * n
            batches = [self._positions(p, min(p + b, end)) for p in range(start, end, b)]
            if self.pad_last and batches and len(batches[-1]) < b:
                batches[-1] = batches[-1] + self._order(start // n)[:b - len(batches[-1])]
        mine = []
        for g, batch in enumerate(batches, start=self._first_group):
            if g % workers == worker:
                cuts = [len(batch) * r // replicas for r in range(replicas + 1)]
                mine.append(batch[cuts[replica]:cuts[replica + 1]])
        return mine, end, len(batches)

    def __iter__(self) -> Iterator[Any]:
        items, end, count = self._pass()
        workers = self._topology()[1]
        if not items:
            self.start_index, self._first_group = end, (self._first_group + count) % workers
        for i, item in enumerate(items):
            if i == len(items) - 1:  # the pass is handed out whole (a loop may stop at its last batch without
                # asking for more): the next pass continues the stream, and the workers' turn
                self.start_index, self._first_group = end, (self._first_group + count) % workers
            yield item

    def __len__(self) -> int:
        return len(self._pass()[0])
