"""How a replica's process ends (cs_run.replicas.end_process, the end of every cs-run command in a replica):
as the interpreter begins its exit (atexit handlers, flushed output), after a barrier that waits for the peers
and for its own collectives still in flight, and then without the interpreter's finalization, in which the
process groups' gloo threads (torch keeps the groups past destroy_process_group) could take the GIL of a
finalizing interpreter and abort the process (std::terminate, SIGABRT) after a run that had finished."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.processes import finish

SCRIPT = '''
import atexit, sys, time, torch, torch.distributed as dist
from cs_run import replicas

class Late:
    def __init__(self, path):
        self.path = path

    def __del__(self, open=open):  # runs only in the interpreter's finalization (module globals are gone by then)
        open(self.path, "w").close()

late = Late(sys.argv[1] + ".finalized")
atexit.register(lambda: open(sys.argv[1] + ".atexit", "w").close())
replicas.start(2, "CPU", timeout_s=60)
held = dist.group.WORLD  # what FSDP2 keeps: the group outlives destroy_process_group
t = torch.ones(4)
if replicas.ordinal() == 1:  # a collective still in flight when this replica's run ends
    dist.all_reduce(t, async_op=True)
    del t
else:  # ...which its peer joins a second later
    time.sleep(1.0)
    dist.all_reduce(t)
    assert t.tolist() == [2.0] * 4
print("unflushed", replicas.ordinal(), end="")
replicas.end_process(int(sys.argv[2]))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_replica_ends_after_its_peers_and_pending_collectives_runs_atexit_and_skips_finalization(tmp_path):
    script = tmp_path / "replica.py"
    script.write_text(SCRIPT)
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path / f"r{rank}"), "0"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    for rank, proc in enumerate(procs):
        code, out, err = finish(proc, 120, f"replica {rank}")
        assert code == 0, err[-3000:]
        assert out == f"unflushed {rank}" and "terminate called" not in err
        assert (tmp_path / f"r{rank}.atexit").exists() and not (tmp_path / f"r{rank}.finalized").exists()
