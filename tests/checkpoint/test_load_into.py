"""load_into: the resume path reads straight into existing tensors, exactly, or names the key."""

from __future__ import annotations

import copy

import pytest
import torch
from ckpt_helpers import assert_same
from conftest import TinyMLP, make_batches

from cs_run.checkpoint import check_target, load, load_into, save
from cs_run.checkpoint.h5 import TargetMismatchError
from cs_run.errors import CheckpointError


def _train(model, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def test_resume_continues_bit_identically(tmp_path):
    torch.manual_seed(0)
    model = TinyMLP()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    batches = make_batches(n=6)
    _train(model, opt, batches[:3])
    save({"model": model.state_dict(), "optimizer": opt.state_dict(), "global_step": 3}, tmp_path / "c.mdl")
    reference = copy.deepcopy((model, opt))
    _train(*reference, batches[3:])

    torch.manual_seed(1)
    resumed = TinyMLP()
    ropt = torch.optim.AdamW(resumed.parameters(), lr=0.01)
    _train(resumed, ropt, batches[:1])  # optimizer state exists, values differ
    ptrs = {k: v.data_ptr() for k, v in resumed.state_dict().items()}
    target = {"model": resumed.state_dict(), "optimizer": ropt.state_dict()}
    loaded = load_into(tmp_path / "c.mdl", target)
    assert {k: v.data_ptr() for k, v in resumed.state_dict().items()} == ptrs  # read in place
    ropt.load_state_dict(loaded["optimizer"])
    assert loaded["global_step"] == 3 and loaded["model"]["fc1.weight"] is target["model"]["fc1.weight"]
    _train(resumed, ropt, batches[3:])
    assert_same(reference[0].state_dict(), resumed.state_dict())


def test_tensors_not_in_target_are_loaded(tmp_path):
    save({"model": {"w": torch.ones(3)}, "optimizer": {"state": {0: {"m": torch.full((3,), 2.0)}}}}, tmp_path / "c.h5")
    w = torch.zeros(3)
    got = load_into(tmp_path / "c.h5", {"model": {"w": w}, "optimizer": {"state": {}}})
    assert got["model"]["w"] is w and torch.equal(w, torch.ones(3))
    assert torch.equal(got["optimizer"]["state"][0]["m"], torch.full((3,), 2.0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.bool, torch.int64, torch.complex64, torch.float16])
def test_dtypes_zero_d_and_noncontiguous_targets(tmp_path, dtype):
    src = {"a": torch.randn(4, 5).to(dtype), "s": torch.tensor(3).to(dtype), "e": torch.zeros(0, 2, dtype=dtype)}
    save(src, tmp_path / "c.h5")
    nc = torch.zeros(5, 4, dtype=dtype).t()  # a non-contiguous target is filled through a staging copy
    target = {"a": nc, "s": torch.zeros((), dtype=dtype), "e": torch.ones(0, 2, dtype=dtype)}
    load_into(tmp_path / "c.h5", target)
    assert_same(src, {k: v.contiguous() for k, v in target.items()})


def test_tied_target(tmp_path):
    w = torch.randn(3, 3)
    save({"emb": w, "head": w}, tmp_path / "c.h5")
    shared = torch.zeros(3, 3)
    got = load_into(tmp_path / "c.h5", {"emb": shared, "head": shared})
    assert torch.equal(shared, w) and got["emb"] is got["head"] is shared


def test_parameters_as_targets(tmp_path, tiny_mlp):
    save({"model": tiny_mlp.state_dict()}, tmp_path / "c.h5")
    other = TinyMLP()
    load_into(tmp_path / "c.h5", {"model": dict(other.named_parameters())})
    assert torch.equal(other.fc1.weight, tiny_mlp.fc1.weight)


def test_missing_key_and_mismatch_are_named(tmp_path):
    save({"model": {"w": torch.ones(2, 3), "i": torch.ones(2, dtype=torch.int32)}, "step": 1}, tmp_path / "c.h5")
    untouched = torch.zeros(2, 3)
    with pytest.raises(CheckpointError, match=r"no key 'model.extra'"):
        load_into(tmp_path / "c.h5", {"model": {"w": untouched, "extra": torch.zeros(1)}})
    assert torch.equal(untouched, torch.zeros(2, 3))  # checked before the first read
    with pytest.raises(CheckpointError, match=r"key 'model.w' is float32\[2, 3\] in the file but float32\[3, 2\]"):
        load_into(tmp_path / "c.h5", {"model": {"w": torch.zeros(3, 2)}})
    with pytest.raises(CheckpointError, match=r"key 'model.i' is int32\[2\] in the file but int64\[2\]"):
        load_into(tmp_path / "c.h5", {"model": {"i": torch.zeros(2, dtype=torch.int64)}})
    with pytest.raises(CheckpointError, match=r"key 'step' holds a int"):
        load_into(tmp_path / "c.h5", {"step": torch.zeros(())})


def test_torch_file_and_compressed_file_as_source(tmp_path):
    obj = {"w": torch.randn(4), "step": 2}
    torch.save(obj, tmp_path / "c.pt")
    save(obj, tmp_path / "c.h5", compression="gzip")
    for name in ("c.pt", "c.h5"):
        w = torch.zeros(4)
        assert load_into(tmp_path / name, {"w": w})["step"] == 2
        assert torch.equal(w, obj["w"])


def test_verify_in_load_into(tmp_path):
    save({"w": torch.ones(100)}, tmp_path / "c.h5")
    w = torch.zeros(100)
    load_into(tmp_path / "c.h5", {"w": w}, verify=True)
    assert torch.equal(w, load(tmp_path / "c.h5")["w"])


def test_many_small_tensors_read_in_runs_match_load(tmp_path):
    """The batched preadv path: thousands of small tensors, mixed sizes and dtypes, some not targeted."""
    g = torch.Generator().manual_seed(0)
    state = {f"t{i}": torch.randn(int(torch.randint(0, 300, (1,), generator=g)), generator=g).to(
        (torch.float32, torch.bfloat16, torch.int64)[i % 3]) for i in range(1500)}
    save(state, tmp_path / "c.h5")
    target = {k: torch.empty_like(v) for k, v in state.items() if int(k[1:]) % 5}  # every 5th left out
    loaded = load_into(tmp_path / "c.h5", target)
    for key, value in state.items():
        assert torch.equal(loaded[key], value), key
        if key in target:
            assert loaded[key] is target[key]


def test_truncated_file_in_batched_read_names_a_key(tmp_path):
    state = {f"t{i}": torch.full((64,), float(i)) for i in range(50)}
    save(state, tmp_path / "c.h5")
    data = (tmp_path / "c.h5").read_bytes()
    (tmp_path / "cut.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.h5"):
        load_into(tmp_path / "cut.h5", {k: torch.empty(64) for k in state})


def test_large_tensor_is_read_in_parallel_slices(tmp_path):
    """A tensor of 2+ slices (32 MiB and more) is read by two threads into the target's own memory."""
    from cs_run.checkpoint import reader

    n = (2 * reader._SLICE + 12_345) // 4  # not a whole number of slices
    state = {"big": torch.arange(n, dtype=torch.float32), "small": torch.ones(3)}
    save(state, tmp_path / "c.h5")
    target = {"big": torch.empty(n), "small": torch.empty(3)}
    pointer = target["big"].data_ptr()
    load_into(tmp_path / "c.h5", target)
    assert torch.equal(target["big"], state["big"]) and target["big"].data_ptr() == pointer


def test_short_reads_are_resumed(tmp_path, monkeypatch):
    """preadv may return fewer bytes than asked (signals, some file systems): reading continues."""
    import os as real_os

    from cs_run.checkpoint import reader

    real = real_os.preadv

    def stingy(fd, buffers, offset):
        view = memoryview(buffers[0]).cast("B")
        return real(fd, [view[: min(len(view), 5)]], offset)

    monkeypatch.setattr(reader.os, "preadv", stingy)
    state = {"a": torch.randn(7, 3), "b": torch.randn(()).to(torch.bfloat16), "c": torch.arange(11)}
    save(state, tmp_path / "c.h5")
    target = {k: torch.empty_like(v) for k, v in state.items()}
    load_into(tmp_path / "c.h5", target)
    assert all(torch.equal(target[k], v) for k, v in state.items())


def test_materialized_load_with_threaded_reads(tmp_path):
    """Reads of 1 MiB and more finish on reader threads; every kind of leaf is complete on return."""
    import numpy as np

    g = torch.Generator().manual_seed(3)
    state = {
        "a": torch.randn(600_000, generator=g),
        "b": torch.randn(700_000, generator=g).to(torch.bfloat16),
        "raw": bytes(np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)),
        "arr": np.random.default_rng(1).standard_normal(400_000),
        "scalar": np.float32(2.5),
    }
    save(state, tmp_path / "c.h5")
    for map_location in (None, "cpu", lambda t, saved: t.clone()):  # a callable sees finished tensors
        got = load(tmp_path / "c.h5", map_location=map_location, lazy=False)
        assert torch.equal(got["a"], state["a"]) and torch.equal(got["b"], state["b"])
        assert got["raw"] == state["raw"] and got["scalar"] == state["scalar"]
        np.testing.assert_array_equal(got["arr"], state["arr"])


@pytest.mark.parametrize("name", ["c.h5", "c.pt"])
def test_check_target_refuses_exactly_what_load_into_refuses(tmp_path, name):
    # check_target is load_into's fit rule without the read (a run checks its start checkpoint with it
    # before it writes anything): for every target, both accept or both raise the same message.
    obj = {"model": {"w": torch.ones(2, 3), "i": torch.ones(2, dtype=torch.int32)}, "step": 1}
    save(obj, tmp_path / "c.h5")
    torch.save(obj, tmp_path / "c.pt")
    targets = [
        {"model": {"w": torch.zeros(2, 3)}},  # fits
        {"model": {"w": torch.zeros(2, 3), "i": torch.zeros(2, dtype=torch.int32)}},  # fits
        {"model": {"w": torch.zeros(2, 3), "extra": torch.zeros(1)}},  # a key the file lacks
        {"model": {"w": torch.zeros(3, 2)}},  # another shape
        {"model": {"i": torch.zeros(2, dtype=torch.int64)}},  # another dtype
        {"step": torch.zeros(())},  # a scalar where the target has a tensor
        {"model": {"w": torch.zeros(2, 3)}, "optimizer": {"state": {"0": {"momentum": torch.zeros(2, 3)}}}},
    ]
    outcomes = []
    for target in targets:
        probe = copy.deepcopy(target)
        try:
            check_target(tmp_path / name, probe)
            checked = None
        except TargetMismatchError as e:
            checked = str(e)
        assert all(torch.equal(a, b) for a, b in zip(leaf_tensors(probe), leaf_tensors(target)))  # nothing read
        try:
            load_into(tmp_path / name, target)
            loaded = None
        except TargetMismatchError as e:
            loaded = str(e)
        assert checked == loaded
        outcomes.append(checked is None)
    assert outcomes[:3] == [True, True, False] and not outcomes[-1]
    assert outcomes[3:6] == [False] * 3


def leaf_tensors(tree):
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in leaf_tensors(v)]
    return [tree]
