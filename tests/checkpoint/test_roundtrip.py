"""Round trips: every dtype, odd shapes, nested structures, ties; against torch.save/torch.load."""

from __future__ import annotations

import collections
import io
import tempfile

import numpy as np
import pytest
import torch
from ckpt_helpers import assert_same, assert_ties
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cs_run.checkpoint import load, load_into, save
from cs_run.checkpoint.format import TORCH_DTYPES
from cs_run.errors import CheckpointError

ALL_DTYPES = sorted(TORCH_DTYPES)


def _random_tensor(dtype: torch.dtype, shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)  # every bit pattern, NaNs and denormals included


def _torch_roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("name", ALL_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4)])
def test_every_dtype_and_shape_bit_exact(tmp_path, name, shape):
    t = _random_tensor(TORCH_DTYPES[name][0], shape, seed=len(name))
    obj = {"t": t, "nc": t.unsqueeze(0).expand(2, *t.shape).transpose(0, -1) if t.dim() else t}
    save(obj, tmp_path / "c.h5")
    for lazy in (True, False):
        got = load(tmp_path / "c.h5", lazy=lazy)
        assert_same(_torch_roundtrip(obj), got)  # independent reference: torch.save/torch.load
        assert got["t"].is_contiguous()


def test_state_dicts_types_and_metadata(tmp_path, tiny_mlp):
    opt = torch.optim.Adam(tiny_mlp.parameters(), lr=0.01)
    tiny_mlp(torch.randn(4, 8)).sum().backward()
    opt.step()
    obj = {"model": tiny_mlp.state_dict(), "optimizer": opt.state_dict(), "global_step": 3,
           "rng": {"torch": torch.get_rng_state(), "numpy": np.random.RandomState(0).get_state()}}
    save(obj, tmp_path / "c.mdl")
    got = load(tmp_path / "c.mdl")
    assert_same(_torch_roundtrip(obj), got)
    assert type(got["model"]) is collections.OrderedDict
    assert 0 in got["optimizer"]["state"]  # int keys stay ints


def test_scalars_strings_none_bytes_numpy(tmp_path):
    obj = [None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**100, -(3**50), 1.5, float("nan"), float("-inf"), -0.0,
           3 - 4j, "", "h\u00e9llo/./%", "nul\x00inside", b"", b"\x00\xff", np.arange(6, dtype=">i4").reshape(2, 3),
           np.float16(1.5), np.bool_(True), np.zeros((0, 2)), np.complex64(1j), (), [], {}]
    save(obj, tmp_path / "c.h5")
    for lazy in (True, False):
        assert_same(obj, load(tmp_path / "c.h5", lazy=lazy))


def test_awkward_keys(tmp_path):
    obj = {"": 1, ".": 2, "..": 3, "a/b": 4, "%2F": 5, "a.b": 6, "a": {"b": 7}, 5: 8, "5": 9, None: 10, 1.5: 11, True: 12}
    save(obj, tmp_path / "c.h5")
    assert_same(obj, load(tmp_path / "c.h5"))


def test_bare_tensor_and_tuple_root(tmp_path):
    t = torch.arange(4.0)
    save(t, tmp_path / "a.h5")
    assert_same(t, load(tmp_path / "a.h5"))
    save((t, t), tmp_path / "b.h5")
    got = load(tmp_path / "b.h5")
    assert got[0] is got[1]


def test_parameter_and_requires_grad(tmp_path):
    p = torch.nn.Parameter(torch.randn(3))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    obj = {"p": p, "frozen": frozen, "rg": torch.ones(2, requires_grad=True), "plain": torch.ones(1)}
    save(obj, tmp_path / "c.h5")
    got = load(tmp_path / "c.h5")
    assert_same(_torch_roundtrip(obj), got)
    assert isinstance(got["p"], torch.nn.Parameter) and got["p"].requires_grad
    assert isinstance(got["frozen"], torch.nn.Parameter) and not got["frozen"].requires_grad


def test_tied_weights_stored_once_and_restored_tied(tmp_path):
    emb = torch.nn.Embedding(1000, 64)
    head = torch.nn.Linear(64, 1000, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    sd = model.state_dict()
    save({"model": sd}, tmp_path / "tied.h5")
    save({"model": {"emb.weight": sd["emb.weight"], "head.weight": sd["head.weight"].clone()}}, tmp_path / "untied.h5")
    got = load(tmp_path / "tied.h5")["model"]
    assert got["emb.weight"] is got["head.weight"]
    size_tied = (tmp_path / "tied.h5").stat().st_size
    size_untied = (tmp_path / "untied.h5").stat().st_size
    assert size_untied - size_tied >= 1000 * 64 * 4  # the tied copy costs no data bytes
    got["emb.weight"][0, 0] = 123.0  # still tied after a write
    assert got["head.weight"][0, 0] == 123.0


def test_lazy_tensors_are_real_writable_and_private(tmp_path):
    t = torch.arange(1000, dtype=torch.float32)
    save({"t": t}, tmp_path / "c.h5")
    got = load(tmp_path / "c.h5")["t"]
    assert type(got) is torch.Tensor
    got.add_(1)  # copy-on-write: allowed, and never reaches the file
    assert torch.equal(got, t + 1)
    assert torch.equal(load(tmp_path / "c.h5", lazy=False)["t"], t)
    (tmp_path / "c.h5").unlink()  # mapped tensors outlive the file's name
    assert got.sum().item() == (t + 1).sum().item()


def test_map_location_forms(tmp_path):
    save({"t": torch.ones(2)}, tmp_path / "c.h5")
    assert load(tmp_path / "c.h5", map_location="cpu")["t"].device.type == "cpu"
    assert load(tmp_path / "c.h5", map_location=torch.device("cpu"))["t"].device.type == "cpu"
    assert load(tmp_path / "c.h5", map_location={"cuda:0": "cpu"})["t"].device.type == "cpu"
    seen = []
    got = load(tmp_path / "c.h5", map_location=lambda t, loc: seen.append(loc) or t * 2)
    assert seen == ["cpu"] and torch.equal(got["t"], torch.full((2,), 2.0))


@pytest.mark.parametrize("compression", ["gzip", "lzf"])
def test_compression_roundtrip(tmp_path, compression):
    obj = {"z": torch.zeros(100_000), "r": torch.randn(10, 10), "s": torch.ones(()), "bf": torch.ones(5, dtype=torch.bfloat16)}
    save(obj, tmp_path / "c.h5", compression=compression)
    assert (tmp_path / "c.h5").stat().st_size < 50_000  # 400 kB of zeros compressed away
    assert_same(obj, load(tmp_path / "c.h5", verify=True))


def test_bad_compression_is_params_error(tmp_path):
    from cs_run.errors import ParamsError

    with pytest.raises(ParamsError, match="invalid compression 'zip'"):
        save({}, tmp_path / "c.h5", compression="zip")


# ---- property test -------------------------------------------------------------------------

_tensor_dtypes = st.sampled_from(ALL_DTYPES)
_shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)


@st.composite
def _tensors(draw):
    t = _random_tensor(TORCH_DTYPES[draw(_tensor_dtypes)][0], draw(_shapes), draw(st.integers(0, 10**6)))
    if t.dim() >= 2 and draw(st.booleans()):
        t = t.transpose(0, 1)  # non-contiguous view
    return t


_np_arrays = st.builds(lambda dt, shape, seed: np.random.default_rng(seed).integers(0, 100, shape).astype(dt),
                       st.sampled_from(["f4", "f8", "i8", "u1", "bool", "c8", "f2"]), _shapes, st.integers(0, 1000))
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**80), 2**80),
                     st.floats(allow_nan=True), st.complex_numbers(allow_nan=False),
                     st.text(max_size=8), st.binary(max_size=8))
_keys = st.one_of(st.text(max_size=6), st.integers(-3, 50))


@st.composite
def _structures(draw):
    pool = draw(st.lists(_tensors(), min_size=1, max_size=4))
    leaf = st.one_of(st.sampled_from(pool), _tensors(), _np_arrays, _scalars)  # sampled_from -> ties
    return draw(st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.lists(inner, max_size=3).map(tuple),
            st.dictionaries(_keys, inner, max_size=4),
            st.dictionaries(st.text(max_size=6), inner, max_size=3).map(collections.OrderedDict),
        ),
        max_leaves=12,
    ))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(obj=_structures(), lazy=st.booleans())
def test_property_roundtrip_exact_types_and_ties(obj, lazy):
    with tempfile.TemporaryDirectory() as d:
        save(obj, f"{d}/c.h5")
        got = load(f"{d}/c.h5", lazy=lazy, verify=True)
        assert_same(obj, got)
        assert_ties(obj, got)


# ---- pickle policy -------------------------------------------------------------------------

class _Thing:
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return isinstance(other, _Thing) and other.x == self.x


def test_unsupported_type_refused_before_any_file(tmp_path):
    with pytest.raises(CheckpointError, match=r"key 'a\.1\.obj'.*_Thing.*allow_pickle=True"):
        save({"a": [1, {"obj": _Thing(1)}]}, tmp_path / "c.h5")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(CheckpointError, match=r"key 's'.*to_dense"):
        save({"s": torch.eye(2).to_sparse()}, tmp_path / "c.h5")
    with pytest.raises(CheckpointError, match="dict key"):
        save({(1, 2): 3}, tmp_path / "c.h5")
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(CheckpointError, match="contains itself"):
        save(cyclic, tmp_path / "c.h5")


def test_pickle_needs_opt_in_on_both_sides(tmp_path):
    save({"obj": _Thing(3), "t": torch.ones(1)}, tmp_path / "c.h5", allow_pickle=True)
    with pytest.raises(CheckpointError, match=r"key 'obj' holds a pickled Python object .*_Thing.*allow_pickle=True"):
        load(tmp_path / "c.h5")
    assert load(tmp_path / "c.h5", allow_pickle=True)["obj"] == _Thing(3)


def test_torch_pickle_file_loads_weights_only(tmp_path):
    obj = {"w": torch.randn(3), "step": 4}
    torch.save(obj, tmp_path / "c.pt")
    assert_same(obj, load(tmp_path / "c.pt"))
    torch.save({"obj": _Thing(1)}, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match="not a readable torch file.*allow_pickle"):
        load(tmp_path / "bad.pt")
    assert load(tmp_path / "bad.pt", allow_pickle=True)["obj"] == _Thing(1)


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_same_state_saves_to_identical_bytes(tmp_path, compression):
    """No timestamps in the file: equal states give equal files (hashable, deduplicable)."""
    import time

    state = {"model": {"w": torch.arange(12.0).reshape(3, 4), "b": torch.zeros(4)}, "global_step": 7, "name": "x",
             "none": None, "scalar": torch.tensor(1.5)}
    save(state, tmp_path / "a.h5", compression=compression)
    time.sleep(1.1)  # HDF5 object timestamps have one-second resolution
    save(state, tmp_path / "b.h5", compression=compression)
    assert (tmp_path / "a.h5").read_bytes() == (tmp_path / "b.h5").read_bytes()


def test_files_from_the_earlier_h5py_writer_still_load(tmp_path):
    """Format version 1 as first written through h5py (superblock 3, new-style group) before the encoder."""
    import pathlib
    import shutil

    path = tmp_path / "old.h5"
    shutil.copy(pathlib.Path(__file__).parent / "data" / "v1_h5py_writer.h5", path)  # a fixed file, read-only use
    w = torch.arange(15.0).reshape(5, 3)
    for lazy in (True, False):
        got = load(path, lazy=lazy, verify=True)
        assert torch.equal(got["model"]["w"], w) and got["model"]["tied"] is got["model"]["w"]
        assert torch.equal(got["model"]["b"], torch.tensor([1.0, -2.0, 0.5], dtype=torch.bfloat16))
        assert got["step"] == 3 and got["name"] == "x" and got["none"] is None and got["empty"].shape == (0, 2)
        np.testing.assert_array_equal(got["arr"], np.arange(4))
    target = {"model": {"w": torch.empty(5, 3)}}
    load_into(path, target)
    assert torch.equal(target["model"]["w"], w)
