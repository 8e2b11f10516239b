"""Data-parallel replicas on torch.distributed: launch, join, the process group, the batch split.

``num_csx = N`` is N replica processes (see docs/architecture.md#replicas). A process that finds the
env:// rendezvous variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``: set by
``torchrun`` or by :func:`launch`) joins the process group (gloo on the CPU, nccl on CUDA). A process
without them that is asked for N > 1 replicas becomes a launcher: torch's elastic agent starts N local
processes running this process's own command line (exactly what ``torchrun --nproc_per_node N`` would
run), waits for them and exits with their result, so the caller's code after the launch never runs in
the launcher. A failed replica stops the others (the agent locally, the collective timeout across
machines) and the launcher prints one ``Error:`` line naming it.

A replica started by an elastic agent ends when the agent does, however it ends (cs_run._launcher_watch).

It imports only torch, cs_run.errors and cs_run._launcher_watch.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
import uuid
import weakref
from typing import Any, NoReturn, Optional

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch
from torch.nn.parallel import DistributedDataParallel

from cs_run import _launcher_watch
from cs_run.errors import ParamsError

__all__ = ["DEFAULT_COLLECTIVE_TIMEOUT", "JOIN_ENV", "ReplicatedModule", "all_reduce_sum", "broadcast_object",
           "cuda_index", "end_process", "in_replica_env", "is_master", "join_alone", "joined", "launch", "lost_peer",
           "max_values", "mean_value", "ordinal", "record_failure", "record_finished", "replicate", "report_end",
           "reports_to_launcher", "split_batch", "start", "stop_grace", "sum_values", "teardown", "world_size"]

logger = logging.getLogger(__name__)

JOIN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""The env:// rendezvous variables: a process that has all of them is a replica and joins."""
DEFAULT_COLLECTIVE_TIMEOUT = 600
_LAUNCHER_ENV = "CS_RUN_REPLICA_LAUNCHER"  # set by launch() for its replicas: errors go to the launcher
_MONITOR_INTERVAL = 0.1  # seconds between the elastic agent's checks of its replicas
_HOST_GROUP: Any = None  # host numbers travel on gloo (CPU tensors) even when the gradients use nccl
_TIMEOUT_S: Optional[int] = None  # the collective timeout of the group this process joined
_INTERRUPT_CODES = (128 + signal.SIGINT, 128 + signal.SIGTERM)
# What gloo / nccl / the c10d store raise when a peer is gone or silent (not always a DistError subclass), and
# what a compiled step library says when its traced collective failed (the cause is logged above it).
_PEER_LOST = re.compile(r"Connection (closed|reset) by peer|gloo/transport|NCCL|ProcessGroup|[Tt]imed? ?out|Broken pipe"
                        r"|_c10d_functional")


# --------------------------------------------------------------------------------------- topology

def joined() -> bool:
    """True once this process is in a torch.distributed process group."""
    return dist.is_available() and dist.is_initialized()


def in_replica_env() -> bool:
    """True when torchrun (or :func:`launch`) started this process as one replica of several."""
    return all(key in os.environ for key in JOIN_ENV)


def world_size() -> int:
    """Number of replicas: the process group's size, else ``WORLD_SIZE`` of the launcher, else 1."""
    if joined():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def ordinal() -> int:
    """This replica's index (0-based): the process group's rank, else ``RANK``, else 0."""
    if joined():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_master() -> bool:
    """True on ordinal 0, the replica that writes checkpoints, logs, summaries and resolved params."""
    return ordinal() == 0


def split_batch(global_batch: int, num_replicas: int) -> int:
    """The per-replica batch of a global batch (the vendor's rule: the params' batch size is the global
    batch, each replica streams an equal share).

    Raises:
        ValueError: the batch is not a positive multiple of ``num_replicas``; the message names the
            nearest values that split.
    """
    if not isinstance(global_batch, int) or isinstance(global_batch, bool) or global_batch < 1:
        raise ValueError(f"{global_batch!r} is not a positive integer")
    if global_batch % num_replicas:
        lower, upper = global_batch // num_replicas * num_replicas, (global_batch // num_replicas + 1) * num_replicas
        options = f"{lower} or {upper}" if lower else f"{upper}"
        raise ValueError(f"{global_batch} is the global batch of {num_replicas} replicas (num_csx) and must split "
                         f"evenly over them; use {options}")
    return global_batch // num_replicas


# ------------------------------------------------------------------------------------ start / join

def start(num_replicas: int, device_type: str, timeout_s: int = DEFAULT_COLLECTIVE_TIMEOUT) -> None:
    """Make this process one of ``num_replicas`` replicas; every front door calls it before building.

    Already in a group: checks its size. Started by torchrun or :func:`launch`: joins. Asked for more
    than one replica otherwise: launches them (:func:`launch`, never returns). One replica: nothing.

    Raises:
        ParamsError: ``num_replicas`` disagrees with the launcher's WORLD_SIZE, or a launch is not
            possible here (an interactive session, pytest).
    """
    if joined():
        if dist.get_world_size() != num_replicas:
            raise ParamsError(f"runconfig.num_csx: {num_replicas}, but this process is already one of "
                              f"{dist.get_world_size()} replicas; use the same num_csx in every run of the process")
        return
    if in_replica_env():
        launched = int(os.environ["WORLD_SIZE"])
        if launched == 1 and num_replicas == 1:
            return  # torchrun --nproc_per_node 1: a plain single process
        if launched != num_replicas:
            raise ParamsError(f"runconfig.num_csx: {num_replicas}, but the launcher started {launched} processes "
                              f"(WORLD_SIZE={launched}); set --num_csx {launched} or launch {num_replicas}")
        _join(device_type, timeout_s)
        return
    if num_replicas > 1:
        launch(num_replicas, timeout_s)


def _uses_cuda(device_type: str) -> bool:
    return device_type.upper() == "GPU" or (device_type.upper() == "CSX" and torch.cuda.is_available())


def _join(device_type: str, timeout_s: int) -> None:
    cuda = _uses_cuda(device_type)
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if "OMP_NUM_THREADS" not in os.environ:  # share the machine's cores between its replicas
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    global _HOST_GROUP, _TIMEOUT_S
    _TIMEOUT_S = timeout_s
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", timeout=timeout)
    _HOST_GROUP = dist.new_group(backend="gloo", timeout=timeout) if cuda else None
    atexit.register(teardown)
    atexit.register(_launcher_watch.on_exit)  # runs before the teardown: a replica without launcher skips it
    _record_uncaught_exceptions()
    if not is_master():  # one console log: ordinal 0's (the replicas run the same code; the others print errors)
        logging.getLogger("cs_run").setLevel(logging.ERROR)
    logger.info("Replica %d of %d joined (%s, collective timeout %d s)", ordinal(), world_size(),
                dist.get_backend(), timeout_s)


def join_alone(device_type: str) -> None:
    """A process group of this process alone (gloo, or nccl on CUDA), for what needs one with a single
    replica (FSDP2's offload: cs_run.parallel.fsdp). The reductions above see one replica."""
    if joined():
        return
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    atexit.register(teardown)


def teardown() -> None:
    """Leave the process group (registered at exit by the join)."""
    if joined():
        with contextlib.suppress(Exception):  # a peer that already died must not turn an exit into a hang
            dist.destroy_process_group()


def end_process(exit_code: int) -> NoReturn:
    """End this replica's process with ``exit_code`` as the interpreter begins its exit (non-daemon threads
    joined, atexit handlers run: :func:`teardown`, the logs' flush), then ``os._exit`` instead of the
    interpreter's finalization, so a finished run cannot abort there. A replica that succeeded first meets
    the others in a barrier: the process ends only when no peer can need it in a collective.

    Why: the process groups outlive :func:`teardown` (torch keeps a reference that destroy_process_group does
    not drop; their ``pt_gloo_runloop`` threads are still there after it and a gc), so their gloo workers live
    until the process ends. A worker releases a collective's Work only after waking the waiting thread, and
    when that Work holds the last reference to a tensor whose Python object torch preserved (Python let go
    first), freeing it takes the GIL. A foreign thread taking the GIL of a finalizing interpreter is ended by
    pthread_exit, whose unwinding through the noexcept destructor calls std::terminate ("terminate called
    without an active exception", SIGABRT). Replica 1 of a sharded run met it most: its last act is the
    broadcast that commits the checkpoint, and it exits at once.
    """
    if exit_code == 0 and joined():
        with contextlib.suppress(Exception):  # gloo's barrier also waits for this replica's pending collectives
            dist.barrier()  # no replica leaves while a peer may still need it in a collective
    shutdown = getattr(threading, "_shutdown", None)  # what Py_FinalizeEx does first: join non-daemon threads
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(exit_code)


# ----------------------------------------------------------------------------------------- launch

def launch(num_replicas: int, timeout_s: int = DEFAULT_COLLECTIVE_TIMEOUT) -> NoReturn:
    """Run this process's command line in ``num_replicas`` local processes with torch's elastic agent
    (a standalone c10d rendezvous, no restarts), wait for them, and exit: 0 when all succeeded, else the
    failed replica's exit code after one ``Error:`` line naming it. A signal to the launcher goes to the
    replicas once; those still running ``timeout_s`` later are killed.

    Raises:
        ParamsError: the command cannot be rerun (an interactive session, or inside pytest).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if num_replicas > cores:
        logger.warning("runconfig.num_csx: %d replicas on %d CPU cores: each replica's step waits for a core "
                       "(slower than fewer replicas) and each holds its own copy of the model in memory; use at "
                       "most %d", num_replicas, cores, cores)
    command = list(sys.orig_argv[1:])
    if not command or hasattr(sys, "ps1") or sys.flags.interactive or {"ipykernel", "_pytest"} & set(sys.modules):
        raise ParamsError(f"runconfig.num_csx: {num_replicas} replicas rerun this process's command in "
                          f"{num_replicas} processes, which is not possible from an interactive session or a test; "
                          f"run it as a script or command, or under torchrun --nproc_per_node {num_replicas}")
    os.environ[_LAUNCHER_ENV] = "1"
    os.environ[_launcher_watch.LAUNCHER_PID_ENV] = str(os.getpid())  # the replicas end with this process
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)  # the agent's own reports would repeat ours at length
    with tempfile.TemporaryDirectory(prefix="cs_run_replicas_") as logs:
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=num_replicas, run_id=str(uuid.uuid4()),
                              rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                              monitor_interval=_MONITOR_INTERVAL, logs_specs=DefaultLogsSpecs(log_dir=logs),
                              shutdown_timeout=timeout_s)
        try:
            elastic_launch(config, sys.executable)(*command)
        except ChildFailedError as e:
            line, code = _failure_line(e, num_replicas)
            if line:
                print(f"Error: {line}", file=sys.stderr, flush=True)
            raise SystemExit(code) from None
        except SignalException as e:
            # Ctrl-C / SIGTERM of the launcher: the agent passed it on to every replica once (they run in their
            # own sessions), and each finished its step and checkpointed (cs_run.interrupts) or was killed
            # after timeout_s; ordinal 0 logged where it stopped.
            raise SystemExit(128 + int(e.sigval)) from None
    raise SystemExit(0)


def _failure_line(error: ChildFailedError, num_replicas: int) -> tuple[str, int]:
    """The one line about the replica that failed first, and the exit code the job ends with; no line
    when the replicas were interrupted (a signal: ordinal 0 logged where it stopped and what it saved)."""
    codes = {f.exitcode for f in error.failures.values()}
    recorded = any(_own_record(f) for f in error.failures.values())
    if not recorded and codes <= set(_INTERRUPT_CODES):
        return "", max(codes)
    def first(item: tuple[int, Any]) -> tuple[int, float, int]:
        rank, failure = item
        own = _own_record(failure)
        # A cause before a consequence: a recorded error, then a death (a signal, an exit without a record),
        # then a replica stopped by SIGTERM / SIGINT - what the agent sends the rest once one has failed, so
        # most likely its doing - and last a replica that only lost its peers. Among equals the earliest,
        # then the lowest ordinal (an unrecorded failure's time is the agent's, in whole seconds).
        if own:
            kind = 3 if own.get("peer_lost") else 0
        else:
            kind = 2 if _stopped_by_interrupt(failure.exitcode) else 1
        return (kind, own["time"] if own else failure.timestamp, rank)

    rank, failure = min(error.failures.items(), key=first)
    own = _own_record(failure)
    rerun = "all replicas were stopped; rerun the same command to resume from the newest checkpoint"
    if any(_record(f).get("finished") for f in error.failures.values()):  # replicas step together: all ended
        rerun = "after the run had completed: its last checkpoint is written, nothing to rerun"
    if own:
        return f"replica {rank} of {num_replicas} failed: {own['line']} ({rerun})", int(own["exit_code"]) or 1
    if failure.exitcode < 0:
        return (f"replica {rank} of {num_replicas} was killed by signal {failure.signal_name()} ({rerun})", 1)
    return (f"replica {rank} of {num_replicas} exited with code {failure.exitcode} (its output is above; {rerun})",
            failure.exitcode or 1)


def _record(failure: Any) -> dict:
    """What a replica recorded for the launcher (:func:`record_failure`, :func:`record_finished`), or {}."""
    data = failure.error_file_data
    return (data.get("cs_run") or {}) if isinstance(data, dict) else {}


def _own_record(failure: Any) -> Optional[dict]:
    """A replica's recorded error, if it recorded one (a finished run is not an error)."""
    own = _record(failure)
    return own if own and not own.get("finished") else None


def _stopped_by_interrupt(exitcode: int) -> bool:
    """True for a process that SIGINT / SIGTERM ended: killed by it (-N) or exiting with the shell's 128+N
    after stopping itself (cs_run.interrupts)."""
    return exitcode in _INTERRUPT_CODES or -exitcode in (signal.SIGINT, signal.SIGTERM)


def stop_grace() -> Optional[int]:
    """Seconds a replica may run on after its first SIGINT / SIGTERM before it ends itself
    (``interrupts.stop_on_signal``): the collective timeout, as long as its peers wait; None for one process."""
    return _TIMEOUT_S if joined() and dist.get_world_size() > 1 else None


def report_end(line: str, exit_code: int) -> None:
    """How a process that ends itself (``interrupts``' watchdog) says why: recorded for the launcher, which
    prints the job's one line, else an ``Error:`` line on stderr."""
    if in_replica_env():
        record_failure(line, exit_code)
    if not reports_to_launcher():
        print(f"Error: {line}", file=sys.stderr, flush=True)


def lost_peer(exc: BaseException) -> bool:
    """True for the error of a collective whose peers died or did not answer within the timeout: the
    consequence of another replica's failure, not a cause (the launcher names the cause)."""
    return in_replica_env() and (isinstance(exc, dist.DistError) or
                                 (isinstance(exc, RuntimeError) and bool(_PEER_LOST.search(str(exc)))))


def reports_to_launcher() -> bool:
    """True in a replica that :func:`launch` started: its ``Error:`` line goes to the launcher, which
    prints the job's one line (under torchrun every replica prints its own)."""
    return os.environ.get(_LAUNCHER_ENV) == "1" and in_replica_env()


def record_failure(line: str, exit_code: int, peer_lost: bool = False) -> None:
    """Write this replica's one-line error where its elastic agent reads it (``TORCHELASTIC_ERROR_FILE``,
    the format of torch's ``ProcessFailure``), with a precise time and whether it only lost a peer
    (:func:`lost_peer`), so the launcher names the replica that failed first."""
    now = time.time()
    _write_record({"message": line, "timestamp": int(now),
                   "cs_run": {"line": line, "exit_code": exit_code, "time": now, "peer_lost": peer_lost}})


def record_finished() -> None:
    """Note for the launcher that this replica's run completed (read only if the process then fails on its
    way out): its ``Error:`` line then says the run ended, not to rerun a command that has nothing to do."""
    now = time.time()
    _write_record({"message": "finished", "timestamp": int(now), "cs_run": {"finished": True, "time": now}})


def _write_record(data: dict) -> None:
    """Replace this replica's error file (``TORCHELASTIC_ERROR_FILE``) at once: the agent reads it when the
    replica has exited, and a replica killed while writing in place left it empty, which the agent cannot
    parse (a JSONDecodeError instead of the job's one line). A complete file is renamed over it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    with contextlib.suppress(OSError):
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".error_file.")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _record_uncaught_exceptions() -> None:
    """Scripts (the Trainer, a custom loop) do not end in cs-run's reporter: record their uncaught
    exception for the launcher too, then let Python print it as usual."""
    previous = sys.excepthook

    def hook(kind: type, value: BaseException, tb: Any) -> None:
        text = " ".join(str(value).split())
        record_failure(f"{kind.__name__}: {text}" if text else kind.__name__, 1, lost_peer(value))
        previous(kind, value, tb)

    sys.excepthook = hook


# ------------------------------------------------------------------------------------ collectives

def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def broadcast_object(value: Any) -> Any:
    """Ordinal 0's ``value`` on every replica (e.g. which checkpoint they all resume from)."""
    if not joined() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=_HOST_GROUP, device=torch.device("cpu"))
    return box[0]


def all_gather_object(value: Any) -> list[Any]:
    """Every replica's ``value``, in ordinal order, on every replica (also a barrier)."""
    if not joined() or dist.get_world_size() == 1:
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value, group=_HOST_GROUP)
    return out


def _reduce_values(values: tuple, op: Any) -> tuple[float, ...]:
    if not joined() or dist.get_world_size() == 1:
        return tuple(float(v) for v in values)
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    dist.all_reduce(t, op=op, group=_HOST_GROUP)
    return tuple(t.tolist())


def sum_values(*values: float) -> tuple[float, ...]:
    """The sums over replicas of host numbers (loss sums, step counts), in float64."""
    return _reduce_values(values, dist.ReduceOp.SUM)


def max_values(*values: float) -> tuple[float, ...]:
    """The maxima over replicas of host numbers (e.g. a stop request: any replica's)."""
    return _reduce_values(values, dist.ReduceOp.MAX)


def mean_value(value: float) -> float:
    """The mean over replicas of a host number (the logged loss: each replica's is of its own batch)."""
    return sum_values(value)[0] / world_size()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """A new tensor holding the sum of ``tensor`` over replicas (``tensor`` itself is not changed)."""
    if not joined() or dist.get_world_size() == 1:
        return tensor.clone()
    out = tensor.detach().to(_collective_device(), copy=True)
    dist.all_reduce(out)
    return out.to(tensor.device)


class ReplicatedModule(DistributedDataParallel):
    """A module as one data-parallel replica: torch DDP (gradients averaged over replicas in backward),
    whose ``state_dict`` / ``load_state_dict`` are the module's own (no ``module.`` prefix, so
    checkpoints of 1 and N replicas are the same) and whose other attributes are the module's."""

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module.load_state_dict(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("module"), name)


_REPLICATED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def replicate(module: torch.nn.Module, device: Optional[torch.device] = None) -> torch.nn.Module:
    """``module`` as a :class:`ReplicatedModule` when there are several replicas, else itself; one
    wrapper per module (two would all-reduce twice). Its construction broadcasts ordinal 0's weights,
    so every replica starts from the same ones."""
    if not joined() or dist.get_world_size() == 1 or not any(p.requires_grad for p in module.parameters()):
        return module
    if module not in _REPLICATED:
        device_ids = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device is not None and device.type == "cuda" else None
        _REPLICATED[module] = ReplicatedModule(module, device_ids=device_ids)
    return _REPLICATED[module]


def cuda_index() -> int:
    """The CUDA device of this process: its local rank in a replica, else the current device."""
    return int(os.environ["LOCAL_RANK"]) if in_replica_env() and "LOCAL_RANK" in os.environ \
        else torch.cuda.current_device()

