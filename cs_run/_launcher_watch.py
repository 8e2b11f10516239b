"""A replica ends with the process that launched it (docs/architecture.md#replicas).

Torch's elastic agent (cs-run's own launch, or ``torchrun``'s) starts every replica in its own session and
asks the kernel for nothing when it dies itself, so a launcher killed with SIGKILL (the OOM killer, a job
scheduler, ``kill -9``) used to leave its replicas training, saving and pruning checkpoints with no parent.
A replica therefore watches its launcher, which is its parent process, from a daemon thread started when
``cs_run`` is first imported (:func:`watch_launcher`): a pidfd (``os.pidfd_open``) becomes readable when the
launcher has ended, however it ended, and the thread then ends the replica at once (:func:`_end`). Where no
pidfd can be had (an old kernel, a seccomp filter) the thread polls the parent pid instead. And right before
a checkpoint's commit rename, :func:`check_alive` asks the kernel whether the parent is still the launcher
(``getppid``, exact when asked), so a replica whose thread has not run yet (the main thread holds the GIL in
a long write) still commits no checkpoint after its launcher ended.

Not ``prctl(PR_SET_PDEATHSIG)`` while it runs: the kernel sends that signal when the *thread* that forked
the child ends, not the process, so a launcher that starts its replicas from a short-lived thread would
kill healthy ones. Only a replica that exits arms it (:func:`on_exit`): Python's finalization stops daemon
threads, and an exit can take seconds (a process group's teardown), during which only the kernel can
still end it with its launcher.

A leaf module: the standard library only.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import select
import signal
import threading
import time
from typing import Callable, Optional

__all__ = ["LAUNCHER_PID_ENV", "LauncherGone", "check_alive", "gone", "on_exit", "watch", "watch_launcher"]

LAUNCHER_PID_ENV = "CS_RUN_LAUNCHER_PID"
"""Set by cs-run's launch (cs_run.replicas) for its replicas: the pid they end with."""
_PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)
_POLL_S = 0.2  # seconds between checks of the parent pid where no pidfd can be had
_PARENT_AT_IMPORT = os.getppid()  # torchrun's agent, in a replica it started (the first moment cs_run runs)
_watched: Optional[tuple[int, int]] = None  # (launcher pid, pid of the process that watches it)


class LauncherGone(RuntimeError):
    """The replica's launcher has ended: what the replica was about to commit is abandoned."""


def watch(launcher: int, on_gone: Callable[[int], None]) -> bool:
    """Watch ``launcher`` (this process's parent): ``on_gone(launcher)`` runs in a daemon thread once it has
    ended, and should end this process. Returns False, watching nothing, when ``launcher`` is not this
    process's parent (any more)."""
    global _watched
    try:
        fd: Optional[int] = os.pidfd_open(launcher)
    except (AttributeError, OSError):  # no pidfd here (not Linux 5.3+, a seccomp filter): poll the parent pid
        fd = None
    # Asked after the open: a launcher that died before it shows here, and the pidfd cannot be a new
    # process's that reused the launcher's pid, since the launcher was still this process's parent then.
    if os.getppid() != launcher:
        if fd is not None:
            os.close(fd)
        return False
    _watched = (launcher, os.getpid())
    atexit.register(on_exit)
    threading.Thread(target=_wait, args=(launcher, fd, on_gone), name="cs_run-launcher-watch", daemon=True).start()
    return True


def _wait(launcher: int, fd: Optional[int], on_gone: Callable[[int], None]) -> None:
    """The watching thread: blocks until the launcher has ended (no cost while it runs), then ``on_gone``."""
    if fd is not None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():
            pass
    else:
        while os.getppid() == launcher:
            time.sleep(_POLL_S)
    on_gone(launcher)


def _ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie its parent has not reaped yet has)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc: ask the kernel for the pid (a zombie counts as alive here)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False


def watch_launcher() -> None:
    """In a process an elastic agent started (cs-run's launch, torchrun: ``TORCHELASTIC_RUN_ID``, a session
    of its own), end with that agent: watch it, or end now when it has already ended. The agent is this
    process's parent: the one launch() names, else the parent this module found at import. Called once, at
    the module's first import. A process a replica starts, and a wrapper script's child (a script should
    ``exec`` its command), is not a replica and watches nothing."""
    if (_watched is not None and _watched[1] == os.getpid()) or "TORCHELASTIC_RUN_ID" not in os.environ \
            or os.getsid(0) != os.getpid():
        return
    named = os.environ.get(LAUNCHER_PID_ENV, "")
    launcher = int(named) if named.isdigit() else _PARENT_AT_IMPORT
    if watch(launcher, _end):
        return
    if named and not _ended(launcher):
        return  # launch()'s launcher runs, and is not this process's parent: not one of its replicas
    _end(launcher)


def _end(launcher: int) -> None:
    """Ends this replica at once (exit 129, as a hang-up): its launcher is gone, so no one would stop it, read
    its result or pass a signal on. One line, from each launcher's first replica; a checkpoint being written
    stays a temporary (atomic writes), the newest complete one is kept."""
    if os.environ.get("LOCAL_RANK", "0") == "0":
        with contextlib.suppress(OSError):
            os.write(2, f"Error: the launcher (pid {launcher}) of these replicas has ended, so they end at once; "
                        "the newest complete checkpoint is kept; rerun the same command to resume from it\n".encode())
    os._exit(128 + signal.SIGHUP)


def on_exit() -> None:
    """At exit (an atexit handler; cs_run.replicas registers it again after its teardown, so it runs first):
    a replica whose launcher is gone ends now, skipping a teardown that would wait on peers; else the kernel
    is asked to SIGKILL it when the launcher dies (``PR_SET_PDEATHSIG``), because once Python finalizes, the
    watching thread can no longer run. Armed only now, the parent-thread caveat (module docstring) costs at
    most the end of an exit."""
    launcher = _gone_launcher()
    if launcher is not None:
        _end(launcher)
    watched = _watched
    if watched is None or watched[1] != os.getpid():
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != watched[0]:  # died before the prctl: the signal will not come
        _end(watched[0])


def gone() -> bool:
    """True in a process that watches its launcher (:func:`watch`) once the launcher has ended: the kernel
    gave this process another parent. False elsewhere (a child forked by the replica, one process alone)."""
    return _gone_launcher() is not None


def _gone_launcher() -> Optional[int]:
    watched = _watched
    if watched is not None and watched[1] == os.getpid() and os.getppid() != watched[0]:
        return watched[0]
    return None


def check_alive(what: str) -> None:
    """Called right before ``what`` is committed (a checkpoint's rename into place).

    Raises:
        LauncherGone: this replica's launcher has ended; nothing is committed.
    """
    launcher = _gone_launcher()
    if launcher is not None:
        raise LauncherGone(f"the launcher of this replica (pid {launcher}) has ended: {what} is not committed and "
                           "the replica ends")


watch_launcher()  # from the first moment cs_run runs in a replica (cs_run/__init__ imports this module)
