"""Data streaming: ``DataLoader(input_fn)``, ``DataExecutor``, ``compute_num_steps``, ``SyntheticDataset``.

Each streaming worker (here: each replica process) calls the ``input_fn`` to build its own torch
DataLoader, so shard the data in the ``input_fn`` with :func:`cs_run.distributed.get_streaming_rank`.
Batches are moved to the backend's device with ``non_blocking=True`` (no host sync; pin memory in the
input_fn for truly asynchronous copies to CUDA).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

import torch
import torch.utils._pytree as pytree

from cs_run import distributed
from cs_run.backend import current_backend
from cs_run.batches import RateMeter, batch_size, cycle, loader_length, move_to_device
from cs_run.engine import closures
from cs_run.errors import ParamsError
from cs_run.interrupts import Interrupted, StopFlag, stop_on_signal
from cs_run.schedule import is_checkpoint_step, is_final_step, step_budget

__all__ = ["DataLoader", "DataExecutor", "DistributedSampler", "Profiler", "RestartableDataLoader", "Schedule",
           "SyntheticDataset", "compute_num_steps", "current_executor"]

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
        """This worker's dataloader (built on first use)."""
        if self._loader is None:
            self._loader = self.input_fn(*self.args, **self.kwargs)
        return self._loader

    @property
    def is_restartable(self) -> bool:
        """True when the input_fn's loader saves and restores its position (:class:`RestartableDataLoader`)."""
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
        with closures.running(self), stop_on_signal() as self._stop:
            last = False
            for i, batch in enumerate(itertools.islice(source, self.num_steps)):
                self._iteration = i
                batch = move_to_device(batch, device)
                self.profiler.tick(batch_size(batch))
                yield batch
                if self._stop.requested and i + 1 < self.num_steps:
                    if self._checkpointed == i or last:
                        raise self._interrupted()
                    last = True  # the signal came after this step's checkpoint closures: one more step saves
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)  # one sync at the end so total_time covers the device work
            self.profiler.finish()


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
@runtime_checkable
class RestartableDataLoader(Protocol):
    """A dataloader that can save and restore where it is (the vendor's protocol): ``state_dict()``
    returns its position, ``load_state_dict(state)`` resumes there."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


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
    """Indices of ``data_source`` for this input stream: shuffled per epoch with ``seed`` (when
    ``shuffle``), starting at ``start_index``, sharded over the streamers (``shard``), optionally in
    whole batches (``batch_size``, ``drop_last`` / ``pad_last``). One stream here: every index.
    """

    def __init__(self, data_source: Any, shuffle: bool = True, seed: int | None = None, start_index: int = 0,
                 shard: bool = True, batch_size: int | None = None, drop_last: bool = True,
                 num_samples: int | None = None, pad_last: bool = False) -> None:
        self.data_source, self.shuffle, self.seed, self.start_index = data_source, shuffle, seed, start_index
        self.batch_size, self.drop_last, self.pad_last = batch_size, drop_last, pad_last
        self.num_samples = len(data_source) if num_samples is None else num_samples
        self.num_shards = distributed.num_streamers() if shard else 1
        self.rank = distributed.get_streaming_rank() if shard else 0
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_samples))
        g = torch.Generator().manual_seed((self.seed or 0) + self.epoch)
        return torch.randperm(self.num_samples, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        order = self._order()[self.start_index:]
        if self.batch_size:
            full = len(order) // self.batch_size * self.batch_size
            if self.pad_last and full < len(order):
                order = order + order[:self.batch_size - (len(order) - full)]
            elif self.drop_last:
                order = order[:full]
            batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
            order = [i for b in batches[self.rank::self.num_shards] for i in b]
        else:
            order = order[self.rank::self.num_shards]
        return iter(order)

    def __len__(self) -> int:
        return sum(1 for _ in iter(self))
