"""Checkpoint benchmark: cs-run H5 vs torch.save/torch.load vs safetensors, on the same data.

Two workloads: a ~0.93 GiB GPT-2-small-like state ({"model": 124M fp32 params, "optimizer": one
Adam moment per param}) and ~2,000 small tensors. For each: save, load (materialized), lazy load,
and restore into existing tensors (``load_into`` vs raw ``readinto`` at the known offsets vs
``torch.load`` + ``copy_``). The save group also shows what the per-tensor CRC32 costs: ours with
crc32 stubbed out, and crc32 alone over every byte (serial; in a save it overlaps the write for
tensors of 1 MiB and more). Loads verify every CRC32 by default: each read group has ours verified
(the default), ours with ``verify=False``, and ours verified with the standard library's zlib CRC32
instead of the fastest one installed (see cs_run.checkpoint.crc); the checksum cost of a load is
verified / unverified in the same run. Reports median time of interleaved repeats, throughput, and peak extra
RSS (VmHWM reset through /proc/self/clear_refs before each operation).

Machine quirks handled: fresh memory is slow on first touch (the timing phase raises glibc's mmap
and trim thresholds and pre-touches a large block so allocations reuse touched pages; memory is
measured in a separate, earlier phase with default malloc), and the page cache does not stay warm
(each file is pre-read right before it is loaded). cs-run's save fsyncs (durable, atomic); the
peers do not, so their save time is also shown with an fsync added.

Run: ``flock /tmp/cs_run_bench.lock .venv/bin/python bench/bench_checkpoint.py [--quick]``
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import tempfile
import time
import zlib

import torch

from cs_run.checkpoint import crc, load, load_into, reader, save, writer
from cs_run.checkpoint.atomic import fsync_path
from cs_run.checkpoint.reader import open_h5, read_spec

GiB, MiB = float(1 << 30), float(1 << 20)


def gpt2_small_state(layers: int = 12, d: int = 768, vocab: int = 50257, ctx: int = 1024) -> dict:
    g = torch.Generator().manual_seed(0)
    shapes = {"wte.weight": (vocab, d), "wpe.weight": (ctx, d)}
    for i in range(layers):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": (d,), p + "ln_1.bias": (d,), p + "attn.c_attn.weight": (d, 3 * d),
                       p + "attn.c_attn.bias": (3 * d,), p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
                       p + "ln_2.weight": (d,), p + "ln_2.bias": (d,), p + "mlp.c_fc.weight": (d, 4 * d),
                       p + "mlp.c_fc.bias": (4 * d,), p + "mlp.c_proj.weight": (4 * d, d), p + "mlp.c_proj.bias": (d,)})
    shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    model = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    state = {i: {"exp_avg": torch.randn(s, generator=g)} for i, s in enumerate(shapes.values())}
    return {"model": model, "optimizer": {"state": state}}


def small_state(n: int = 2000) -> dict:
    g = torch.Generator().manual_seed(1)
    sizes = torch.randint(1, 2048, (n,), generator=g).tolist()
    return {"model": {f"layer{i // 8}.p{i % 8}": torch.randn(s, generator=g) for i, s in enumerate(sizes)}}


def flat(obj: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in obj.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def zeros_like_state(obj):
    return {k: zeros_like_state(v) for k, v in obj.items()} if isinstance(obj, dict) else torch.zeros_like(obj)


def nbytes(obj) -> int:
    return sum(t.nbytes for t in flat(obj).values())


# --- memory / cache helpers --------------------------------------------------------------------
def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> int:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current RSS
    return _status("VmRSS:")


def pre_read(path: str) -> None:
    buf = bytearray(64 << 20)
    with open(path, "rb", buffering=0) as fh:
        while fh.readinto(buf):
            pass


def keep_heap_warm(gib: float) -> None:
    """Make freed memory stay in the heap (no munmap/trim), then touch a big block once."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-1, 1 << 40)  # M_TRIM_THRESHOLD
    libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD (max allowed)
    block = torch.ones(int(gib * GiB) // 4)
    del block


# --- operations ----------------------------------------------------------------------------------
def make_ops(obj: dict, d: str) -> dict:
    import safetensors.torch as st

    fl = flat(obj)
    p = {"ours": f"{d}/c.h5", "torch": f"{d}/c.pt", "st": f"{d}/c.safetensors"}
    target = zeros_like_state(obj)

    def raw_readinto():
        with open_h5(p["ours"]) as f:
            leaves = read_spec(p["ours"], f)["leaves"]
        tgt = flat(target)
        with open(p["ours"], "rb", buffering=0) as fh:
            for s in leaves:
                fh.seek(s["off"])
                fh.readinto(tgt[s["key"]].reshape(-1).view(torch.uint8).numpy())

    def torch_copy():
        src = flat(torch.load(p["torch"], weights_only=True))
        for k, t in flat(target).items():
            t.copy_(src[k])

    def save_without_crc():  # what the per-tensor CRC32 costs: the same save with crc32 stubbed out
        real = writer.crc32
        writer.crc32 = lambda data, value=0: 0
        try:
            save(obj, p["ours"] + ".nocrc")
        finally:
            writer.crc32 = real

    def crc_alone():
        for t in fl.values():
            crc.crc32(t.reshape(-1).view(torch.uint8).numpy())

    def with_stdlib_crc(fn):  # the same call, checksummed by the standard library's zlib
        def run():
            real = reader.crc32
            reader.crc32 = zlib.crc32
            try:
                return fn()
            finally:
                reader.crc32 = real
        return run

    return {
        "save": {"ours": (lambda: save(obj, p["ours"]), None), "ours without CRC32": (save_without_crc, None),
                 "CRC32 alone (serial)": (crc_alone, None), "torch": (lambda: torch.save(obj, p["torch"]), None),
                 "safetensors": (lambda: st.save_file(fl, p["st"]), None)},
        "load": {"ours": (lambda: load(p["ours"], lazy=False), p["ours"]),
                 "ours verify=False": (lambda: load(p["ours"], lazy=False, verify=False), p["ours"]),
                 "ours, stdlib zlib CRC": (with_stdlib_crc(lambda: load(p["ours"], lazy=False)), p["ours"]),
                 "torch": (lambda: torch.load(p["torch"], weights_only=True), p["torch"]),
                 "safetensors": (lambda: st.load_file(p["st"]), p["st"])},
        "lazy": {"ours": (lambda: load(p["ours"]), p["ours"]),
                 "ours verify=False": (lambda: load(p["ours"], verify=False), p["ours"]),
                 "torch mmap": (lambda: torch.load(p["torch"], weights_only=True, mmap=True), p["torch"]),
                 "safetensors load_file": (lambda: st.load_file(p["st"]), p["st"])},
        "restore": {"ours load_into": (lambda: load_into(p["ours"], target), p["ours"]),
                    "ours verify=False": (lambda: load_into(p["ours"], target, verify=False), p["ours"]),
                    "raw readinto": (raw_readinto, p["ours"]),
                    "torch.load+copy_": (torch_copy, p["torch"])},
    }, p


_SAVE_PEERS = ("ours", "torch", "safetensors")  # the other save rows explain ours; they are not peers
_VARIANTS = ("ours without CRC32", "CRC32 alone (serial)", "ours verify=False", "ours, stdlib zlib CRC")


def run_op(fn, path) -> tuple[float, int]:
    if path:
        pre_read(path)
    base = reset_peak()
    t0 = time.perf_counter()
    result = fn()
    dt = time.perf_counter() - t0
    peak = _status("VmHWM:") - base
    del result
    return dt, peak


def bench(name: str, obj: dict, repeats: int, d: str) -> None:
    size = nbytes(obj)
    largest = max(t.nbytes for t in flat(obj).values())
    ops, paths = make_ops(obj, d)
    for fn, _ in ops["save"].values():  # files for the load ops (and a warm-up of each writer)
        fn()
    mem = {g: {v: run_op(fn, path)[1] for v, (fn, path) in variants.items()} for g, variants in ops.items()}
    keep_heap_warm(min(3.0, 2.5 * size / GiB + 0.1))
    times: dict = {g: {v: [] for v in variants} for g, variants in ops.items()}
    fsync_t: dict = {"torch": [], "safetensors": []}
    for r in range(repeats):
        for g, variants in ops.items():
            order = list(variants.items())
            order = order[r % len(order):] + order[: r % len(order)]  # interleave, rotate the order
            for v, (fn, path) in order:
                times[g][v].append(run_op(fn, path)[0])
                if g == "save" and v in fsync_t:
                    t0 = time.perf_counter()
                    fsync_path(paths["torch" if v == "torch" else "st"])
                    fsync_t[v].append(time.perf_counter() - t0)
    print(f"\n== {name}: {len(flat(obj))} tensors, {size / GiB:.3f} GiB, largest {largest / MiB:.1f} MiB, "
          f"median of {repeats} interleaved runs")
    print(f"{'op':<8} {'variant':<22} {'time s':>8} {'GiB/s':>7} {'vs best':>8} {'peak +RSS MiB':>14} {'/largest':>9}")
    for g, variants in times.items():
        med = {v: statistics.median(ts) for v, ts in variants.items()}
        best = min(t for v, t in med.items() if v not in _VARIANTS and (g != "save" or v in _SAVE_PEERS))
        for v, t in med.items():
            extra = f"  (+fsync {statistics.median(fsync_t[v]):.3f}s)" if g == "save" and v in fsync_t else ""
            print(f"{g:<8} {v:<22} {t:8.3f} {size / GiB / t:7.2f} {t / best:7.2f}x "
                  f"{mem[g][v] / MiB:14.1f} {mem[g][v] / largest:9.2f}{extra}")
        if "ours verify=False" in med:
            plain = med["ours verify=False"]
            ours = med["ours" if "ours" in med else "ours load_into"]
            print(f"{g:<8} checksum cost: verified {ours:.3f}s / unverified {plain:.3f}s = {ours / plain:.2f}x "
                  f"({(ours / plain - 1) * 100:+.0f} %) with {crc.CRC32_IMPL}; stdlib zlib: "
                  + (f"{med['ours, stdlib zlib CRC'] / plain:.2f}x" if "ours, stdlib zlib CRC" in med else "not run"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repeat (smoke run)")
    parser.add_argument("--dir", default=None, help="scratch folder (default: a temp dir under /tmp)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    d = tempfile.mkdtemp(prefix="cs_run_bench_ckpt_", dir=args.dir)
    free = shutil.disk_usage(d).free
    if free < 5 * GiB and not args.quick:
        raise SystemExit(f"need ~5 GiB free in {d}, have {free / GiB:.1f} GiB")
    try:
        if args.quick:
            bench("gpt2-like (quick: 2 layers, small vocab)", gpt2_small_state(layers=2, vocab=5000), 1, d)
            bench("2,000 small tensors", small_state(), 1, d)
        else:
            bench("2,000 small tensors", small_state(), 5, d)
            bench("GPT-2-small-like state (model + Adam exp_avg)", gpt2_small_state(), 3, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
