"""``init_method: checkerboard`` against the vendor's rule (cerebras.pytorch.sparse.init 2.10), computed here
entry by entry in numpy float32 scalars:

* density ``d = 1 - s`` (``s`` the float32 sparsity level read on the host);
* ``step(i) = floor(float32(float32(i) * float32(d)) + float32(1e-5))``; a padded row of ``L = cols - 1 +
  ceil(cols / d + 1e-5)`` entries keeps entry ``i`` where ``step(i + 1) != step(i)``;
* row ``r`` of a 2-D weight is that row rolled left by ``r * floor(1 / d - 1e-5)`` (wrapping at ``L``),
  trimmed to ``cols``; a 1-D weight is the padded row trimmed.

A few masks are also written out by hand, to pin the rule itself down.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cs_run.sparse import Static, configure
from cs_run.sparse.init import checkerboard, make_init_method


def vendor_rule(shape: tuple[int, ...], sparsity: float) -> np.ndarray:
    density = 1.0 - float(np.float32(sparsity))
    cols = shape[-1]
    length = cols - 1 + math.ceil(cols / density + 1e-5)

    def step(i: int) -> float:
        return math.floor(np.float32(np.float32(i) * np.float32(density)) + np.float32(1e-5))

    def kept(i: int) -> bool:
        return step(i + 1) != step(i)

    if len(shape) == 1:
        return np.array([kept(j) for j in range(cols)])
    shift = math.floor(1 / density - 1e-5)
    return np.array([[kept((j + r * shift) % length) for j in range(cols)] for r in range(shape[0])])


def mask_of(shape, sparsity) -> np.ndarray:
    return checkerboard(torch.zeros(shape), torch.tensor(sparsity, dtype=torch.float32)).numpy()


HAND = [  # (shape, sparsity, rows as strings of kept (1) / pruned (0))
    ((4, 6), 0.5, ["010101", "101010", "010101", "101010"]),
    # d = 0.39999998: steps 0,0,0,1,1,2,2,2,3,3,4.. (5 * d + 1e-5 rounds up to 2); row shift floor(2.5) = 2
    ((3, 5), 0.6, ["00101", "10100", "10010"]),
    ((2, 4), 0.75, ["0001", "1000"]),  # d = 0.25: every fourth entry, rows start 3 further on
    ((3, 3), 0.0, ["111", "111", "111"]),
    ((7,), 0.5, ["0101010"]),
]


@pytest.mark.parametrize("shape,sparsity,rows", HAND, ids=[f"{s}@{p}" for s, p, _ in HAND])
def test_checkerboard_matches_masks_written_by_hand(shape, sparsity, rows):
    expected = np.array([[c == "1" for c in row] for row in rows]).reshape(shape)
    assert np.array_equal(mask_of(shape, sparsity), expected)
    assert np.array_equal(vendor_rule(shape, sparsity), expected)  # the rule as transcribed above


TABLE = [((4, 6), 0.5), ((3, 5), 0.6), ((7, 3), 0.7), ((13, 4), 0.75), ((6, 9), 0.9), ((2, 7), 0.3),
         ((17, 11), 0.35), ((8, 8), 0.0), ((5, 4), 0.99), ((1, 1), 0.5), ((31, 33), 0.8), ((64, 48), 0.625),
         ((9,), 0.7), ((10,), 0.1), ((48, 64), 0.875)]


@pytest.mark.parametrize("shape,sparsity", TABLE, ids=[f"{s}@{p}" for s, p in TABLE])
def test_checkerboard_is_the_vendors_rule_for_odd_and_non_square_shapes(shape, sparsity):
    got = mask_of(shape, sparsity)
    assert got.shape == shape and got.dtype == np.bool_
    assert np.array_equal(got, vendor_rule(shape, sparsity))


def test_checkerboard_rows_keep_their_share_until_the_roll_wraps():
    # 64 x 48 at 0.625: d = 0.375 (3 of every 8), padded row L = 47 + 129 = 176, rows start 2 further on;
    # the last row's window ends at 2 * 63 + 47 = 173 < 176, so every row keeps 48 * 3 / 8 = 18
    assert (mask_of((64, 48), 0.625).sum(axis=1) == 18).all()
    # 9 x 5 at 0.6: the padded row is "00101001010010100" (L = 17), rows start 2 further on; rows 7 and 8
    # wrap (entries 14, 15, 16, 0, 1 and 16, 0, 1, 2, 3) and keep one where the others keep two
    mask = mask_of((9, 5), 0.6)
    assert mask.sum(axis=1).tolist() == [2] * 7 + [1, 1]
    assert "".join("1" if v else "0" for v in mask[8]) == "00010"


def test_checkerboard_through_configure_masks_and_prunes_the_weight():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 5))
    model.apply(configure({"sparsity": 0.5, "init_method": "checkerboard"}))
    for layer in model:
        expected = torch.from_numpy(vendor_rule(tuple(layer.weight.shape), 0.5))
        assert torch.equal(layer.weight_mask, expected)
        assert (layer.weight[~expected] == 0).all() and (layer.weight[expected] != 0).all()


@pytest.mark.parametrize("shape,sparsity,regex", [
    ((2, 3, 4), 0.5, r"checkerboard makes masks of 1-D and 2-D weights, got shape \[2, 3, 4\]"),
    ((4, 4), 1.0, r"checkerboard needs a sparsity below 1"),
])
def test_checkerboard_refuses_what_the_rule_does_not_define(shape, sparsity, regex):
    with pytest.raises(ValueError, match=regex):
        mask_of(shape, sparsity)


def test_checkerboard_of_a_conv_weight_through_apply_is_one_error_naming_the_parameter():
    model = torch.nn.Sequential(torch.nn.Conv1d(2, 3, 3))
    with pytest.raises(ValueError, match=r"0.weight: init_method checkerboard makes masks of 1-D and 2-D"):
        model.apply(Static(sparsity=0.5, init_method="checkerboard"))


def test_make_init_method_names_checkerboard():
    assert make_init_method("checkerboard") is checkerboard
    with pytest.raises(ValueError, match="one of random, topk, from_zeros, checkerboard or a callable"):
        make_init_method("chess")
