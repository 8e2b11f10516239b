"""models/common/generate.py: greedy decoding against argmax of the full forward, sampling filters against
a hand computation, stopping at eos ids and stop strings, batches against single prompts, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cs_run.models.common.generate import GenerationConfig, filter_logits, generate
from cs_run.models.common.lm import build_model

V = 61
KEYS = dict(vocab_size=V, hidden_size=32, num_heads=4, num_hidden_layers=2, filter_size=48, max_position_embeddings=40,
            dropout_rate=0.0, position_embedding_type="rotary", rotary_dim=8, norm_type="rmsnorm",
            attention_module="multiquery_attention", extra_attention_params={"num_kv_groups": 2},
            attention_sliding_window_length=5)
PROMPTS = [[5, 17, 3, 40, 22, 9, 31], [12, 1], [60, 7, 7, 29]]


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    model = build_model(**KEYS)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # varied continuations, not one token repeated
    return model.model.eval()


def _greedy_by_full_forward(lm, prompt: list[int], n: int) -> list[int]:
    """The reference: no cache, the whole sequence through forward at every step."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(lm(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def test_greedy_equals_argmax_of_the_full_forward_alone_and_batched(lm):
    expected = [_greedy_by_full_forward(lm, p, 10) for p in PROMPTS]
    for batch_size in (None, 1, 2):
        got = generate(lm, PROMPTS, GenerationConfig(max_new_tokens=10, batch_size=batch_size))
        assert [g.tokens for g in got] == expected
        assert {g.finish_reason for g in got} == {"length"}


def _hand_filter(logits: np.ndarray, temperature: float, top_k, top_p) -> np.ndarray:
    """The probabilities sampled from, by the rule as transformers states it: temperature, then keep the k
    largest, then keep the fewest largest whose probability mass reaches top_p."""
    x = logits / temperature
    keep = np.ones_like(x, dtype=bool)
    if top_k is not None:
        keep &= x >= np.sort(x)[::-1][min(top_k, len(x)) - 1]
    if top_p is not None:
        p = np.exp(x - x[keep].max()) * keep
        p /= p.sum()
        order = np.argsort(-p, kind="stable")
        mass, chosen = 0.0, set()
        for i in order:
            chosen.add(i)
            mass += p[i]
            if mass >= top_p:
                break
        keep &= np.isin(np.arange(len(x)), list(chosen))
    p = np.exp(x - x[keep].max()) * keep
    return p / p.sum()


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, None, None), (0.5, None, None), (2.0, 3, None), (1.0, 1, None), (1.0, None, 0.5), (0.7, 5, 0.8),
    (1.0, None, 0.999), (1.0, 50, 0.3), (1.3, 2, 1.0)])
def test_sampling_filters_equal_the_hand_rule(temperature, top_k, top_p):
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(4)) * 2
    config = GenerationConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
    got = torch.softmax(filter_logits(logits, config), dim=-1).numpy()
    for row in range(3):
        np.testing.assert_allclose(got[row], _hand_filter(logits[row].double().numpy(), temperature, top_k, top_p),
                                   rtol=1e-5, atol=1e-7)


def test_sampling_is_seeded_top_k_1_is_greedy_and_draws_stay_in_the_top_k(lm):
    greedy = [g.tokens for g in generate(lm, PROMPTS, GenerationConfig(max_new_tokens=8))]
    one = generate(lm, PROMPTS, GenerationConfig(max_new_tokens=8, do_sample=True, top_k=1, seed=3))
    assert [g.tokens for g in one] == greedy
    sampled = GenerationConfig(max_new_tokens=8, do_sample=True, temperature=1.5, seed=11)
    first, again = generate(lm, PROMPTS, sampled), generate(lm, PROMPTS, sampled)
    assert [g.tokens for g in first] == [g.tokens for g in again]
    other = generate(lm, PROMPTS, GenerationConfig(max_new_tokens=8, do_sample=True, temperature=1.5, seed=12))
    assert [g.tokens for g in other] != [g.tokens for g in first]
    top3 = generate(lm, PROMPTS[:1], GenerationConfig(max_new_tokens=8, do_sample=True, top_k=3, seed=5))[0].tokens
    ids = list(PROMPTS[0])
    with torch.no_grad():
        for token in top3:  # each draw is one of the 3 most likely next tokens of the sequence so far
            assert token in lm(torch.tensor([ids]))[0, -1].topk(3).indices.tolist()
            ids.append(token)


def test_eos_stops_a_sequence_and_keeps_the_others_going(lm):
    full = [g.tokens for g in generate(lm, PROMPTS, GenerationConfig(max_new_tokens=10))]
    eos = full[0][3]  # the 4th token of the first prompt's continuation
    for batch_size in (None, 1):
        got = generate(lm, PROMPTS, GenerationConfig(max_new_tokens=10, eos_token_ids=(eos,), batch_size=batch_size))
        for g, tokens in zip(got, full):
            cut = tokens.index(eos) + 1 if eos in tokens else len(tokens)
            assert g.tokens == tokens[:cut]
            assert g.finish_reason == ("eos" if eos in tokens else "length")


def test_a_stop_string_ends_the_sequence_and_is_cut_from_its_text(lm):
    full = generate(lm, PROMPTS[:1], GenerationConfig(max_new_tokens=10))[0].tokens
    decode = lambda ids: "".join(f"<{t}>" for t in ids)  # noqa: E731 - a toy detokenizer
    stop = f"{full[3]}><{full[4]}"  # spans two tokens
    n = next(n for n in range(1, 11) if stop in decode(full[:n]))  # the first token count whose text holds it
    assert n < 10
    got = generate(lm, PROMPTS[:1], GenerationConfig(max_new_tokens=10, stop_strings=(stop,)), decode)[0]
    assert got.finish_reason == "stop_string"
    assert got.tokens == full[:n]
    text = decode(full)
    assert got.text == text[:text.index(stop)]


@pytest.mark.parametrize("config, message", [
    (dict(max_new_tokens=0), "max_new_tokens: must be >= 1, got 0"),
    (dict(temperature=0.0), "temperature: must be > 0, got 0.0"),
    (dict(temperature=float("nan")), "temperature: must be > 0, got nan"),
    (dict(top_k=0), "top_k: must be >= 1, got 0"),
    (dict(top_p=0.0), r"top_p: must be in \(0, 1\], got 0.0"),
    (dict(top_p=1.5), r"top_p: must be in \(0, 1\], got 1.5"),
    (dict(batch_size=0), "batch_size: must be >= 1, got 0"),
    (dict(stop_strings=("",)), "stop_strings: an empty string would stop every sequence at once"),
])
def test_bad_generation_configs_name_the_field(config, message):
    with pytest.raises(ValueError, match=message):
        GenerationConfig(**config)


@pytest.mark.parametrize("prompts, config, message", [
    ([[1, 2], []], {}, "prompt 1: empty; give at least one token"),
    ([[1, V]], {}, rf"prompt 0: token id {V} is outside the model's vocabulary \(0..{V - 1}\)"),
    ([[1, -1]], {}, r"prompt 0: token id -1 is outside the model's vocabulary"),
    ([[1] * 35], dict(max_new_tokens=6), r"prompt 0: 35 tokens plus max_new_tokens 6 pass the model's "
                                         r"max_position_embeddings \(40\)"),
    ([[1]], dict(stop_strings=("x",)), "stop_strings: need a tokenizer to decode the generated text"),
])
def test_bad_prompts_are_refused_before_decoding(lm, prompts, config, message):
    with pytest.raises(ValueError, match=message):
        generate(lm, prompts, GenerationConfig(**{"max_new_tokens": 4, **config}))
    assert not lm.training
