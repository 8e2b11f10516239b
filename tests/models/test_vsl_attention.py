"""Packed (VSL) batches in the decoder: each document attends only within itself and its positions restart.

The rule is the Model Zoo's (Release_2.10.0 src/cerebras/modelzoo/common/utils/model/transformer_utils.py:564-643,
``create_vsl_mask``: query ``q`` sees key ``k`` when ``0 <= q - k <= attention_span[k]``; gpt2_model.py passes
``position_ids`` to the embeddings and rotary helper). The reference is the same model run on each document
alone (eager, float32, 1e-5), and transformers' Llama with the same weights, both alone and packed with
``position_ids`` and a 4-D mask.
"""

from __future__ import annotations

import pytest
import torch
from hf_helpers import TOL, build, cs_run_weights_as_transformers

from cs_run.models.common.masks import vsl_mask

VOCAB, SEQ = 61, 16
LENGTHS = (5, 8)  # two documents, then 3 padding tokens (span 0, position 0, as the VSL writers pad)


def _packed(lengths=LENGTHS, seq=SEQ, batch=2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_span, position_ids) of ``batch`` rows packing documents of ``lengths``."""
    ids = torch.randint(2, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(3))
    span, pos = torch.zeros(batch, seq, dtype=torch.int32), torch.zeros(batch, seq, dtype=torch.int32)
    start = 0
    for n in lengths:
        span[:, start:start + n] = torch.arange(n - 1, -1, -1)
        pos[:, start:start + n] = torch.arange(n)
        start += n
    return ids, span, pos


def _documents(lengths=LENGTHS):
    start = 0
    for n in lengths:
        yield slice(start, start + n)
        start += n


def test_vsl_mask_is_the_vendors_block_causal_mask():
    """The vendor's docstring example: documents of 3 and 2 tokens."""
    span = torch.tensor([[2, 1, 0, 1, 0]])
    m = float("-inf")
    expected = torch.tensor([[0, m, m, m, m], [0, 0, m, m, m], [0, 0, 0, m, m], [m, m, m, 0, m], [m, m, m, 0, 0]])
    got = vsl_mask(span, torch.float32)
    assert got.shape == (1, 1, 5, 5)
    assert torch.equal(got[0, 0] == 0, expected == 0)
    # one document spanning everything is the plain causal mask; a window applies inside the document
    whole = vsl_mask(torch.arange(4, -1, -1)[None], torch.float32, window=2)[0, 0] == 0
    assert torch.equal(whole, torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0],
                                            [0, 0, 0, 1, 1]], dtype=torch.bool))


POSITIONS = {
    "learned": dict(name="gpt2", position_embedding_type="learned"),
    "fixed": dict(name="gpt2", position_embedding_type="fixed"),
    "rotary": dict(name="llama", position_embedding_type="rotary", rotary_dim=8, norm_type="rmsnorm",
                   nonlinearity="swiglu"),
    "alibi": dict(name="bloom", position_embedding_type="alibi"),
    "sliding window": dict(name="mistral", position_embedding_type="rotary", rotary_dim=8,
                           attention_sliding_window_length=3),
    "window every other layer": dict(name="gpt2", attention_sliding_window_length=3,
                                     sliding_window_every_other_decoder_layer=True),
}


@pytest.mark.parametrize("case", POSITIONS)
def test_each_packed_document_gets_its_logits_alone(case):
    torch.manual_seed(0)
    model = build({"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_heads": 4,
                   "filter_size": 64, "max_position_embeddings": SEQ, "dropout_rate": 0.0, **POSITIONS[case]})
    ids, span, pos = _packed()
    with torch.no_grad():
        packed = model.model(ids, span, pos)
        plain = model.model(ids)
        for doc in _documents():
            alone = model.model(ids[:, doc])
            torch.testing.assert_close(packed[:, doc], alone, **TOL)
        second = list(_documents())[1]
        assert not torch.allclose(plain[:, second], packed[:, second], **TOL)  # packing without VSL leaks


def test_vsl_loss_is_the_documents_losses(tmp_path):
    """The LM loss of a packed batch (loss over both documents' tokens) is their tokens' mean loss alone."""
    torch.manual_seed(0)
    model = build({"name": "gpt2", "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 1, "num_heads": 4,
                   "filter_size": 64, "max_position_embeddings": SEQ, "dropout_rate": 0.0})
    ids, span, pos = _packed()
    labels = torch.roll(ids, -1, 1)
    mask = (torch.arange(SEQ) < sum(LENGTHS)).int().expand(2, -1)
    with torch.no_grad():
        loss = model({"input_ids": ids.int(), "labels": labels.int(), "attention_mask": mask,
                      "attention_span": span, "position_ids": pos})
        alone = [torch.nn.functional.cross_entropy(model.model(ids[:, d]).reshape(-1, VOCAB),
                                                   labels[:, d].reshape(-1), reduction="sum") for d in _documents()]
    torch.testing.assert_close(loss, sum(alone) / mask.sum(), **TOL)


def test_transformers_llama_agrees_packed_and_alone(tmp_path):
    ours, hf = cs_run_weights_as_transformers(
        tmp_path, "LlamaConfig", "LlamaForCausalLM", "llama", vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
    ids, span, pos = _packed()
    with torch.no_grad():
        packed = ours(ids, span, pos)
        allowed = vsl_mask(span, torch.float32) == 0
        hf_packed = hf(input_ids=ids, position_ids=pos.long(),
                       attention_mask=torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
                       ).logits
        for doc in _documents():
            torch.testing.assert_close(packed[:, doc], hf(input_ids=ids[:, doc]).logits, **TOL)
    valid = slice(0, sum(LENGTHS))
    torch.testing.assert_close(packed[:, valid], hf_packed[:, valid], **TOL)
