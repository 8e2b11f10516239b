"""The decoder tells each attention layer whether its mask is the plain causal one (``causal``), which
lets CUDA run FlashAttention through ``is_causal`` instead of the mask. A wrong flag would silently drop a
sliding window there, so the flag is checked against the mask each layer really gets, compared with
``causal_mask`` built without a window (the reference), for every window layout the Model Zoo has."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import build

from cs_run.models.common.attention import MultiheadAttention
from cs_run.models.common.masks import causal_mask

BASE = dict(name="llama", vocab_size=64, hidden_size=32, num_hidden_layers=4, num_heads=4, filter_size=64,
            max_position_embeddings=32, rotary_dim=8)


@pytest.mark.parametrize("window", [
    pytest.param({}, id="no-window"),
    pytest.param({"attention_sliding_window_length": 5}, id="window-every-layer"),
    pytest.param({"attention_sliding_window_length": 5, "sliding_window_every_other_decoder_layer": True},
                 id="every-other-full-first"),
    pytest.param({"attention_sliding_window_length": 5, "sliding_window_every_other_decoder_layer": True,
                  "sliding_window_every_other_decoder_layer_pattern": "sliding_window_first"},
                 id="every-other-sliding-first"),
    pytest.param({"attention_sliding_window_length": 5, "attention_sink_tokens": 2}, id="window-with-sinks"),
])
def test_causal_flag_is_true_exactly_for_the_plain_causal_mask(window, monkeypatch):
    seen = []
    forward = MultiheadAttention.forward

    def spy(self, x, mask, rotary=None, position_bias=None, layer_idx=0, causal=False, cache=None):
        assert cache is None  # the training forward: no KV cache
        seen.append((layer_idx, mask.clone(), causal))
        return forward(self, x, mask, rotary, position_bias, layer_idx, causal)

    monkeypatch.setattr(MultiheadAttention, "forward", spy)
    model = build({**BASE, **window})
    seq = 12
    with torch.no_grad():
        model.model(torch.randint(0, 64, (2, seq)))  # the decoder under the loss wrapper
    assert [i for i, _, _ in seen] == [0, 1, 2, 3]
    plain = causal_mask(seq, torch.device("cpu"), torch.float32)
    for layer, mask, causal in seen:
        assert causal == torch.equal(mask, plain), f"layer {layer}: causal={causal}"
    windowed = [not c for _, _, c in seen]
    expected = {"attention_sliding_window_length" in window}
    if window.get("sliding_window_every_other_decoder_layer"):
        expected = {True, False}
    assert set(windowed) == expected
