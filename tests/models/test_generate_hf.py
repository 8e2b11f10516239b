"""Greedy generation with the KV cache against transformers' ``generate`` on the same weights, for every
decoder family transformers implements: a cs-run model of the family's keys (read from a tiny transformers
config by ``checkpoint convert --from hf``) gets random weights of its own, ``--to hf`` writes them as a
transformers folder, and both generate 12 tokens greedily from each prompt (alone, and cs-run also in one
left-padded batch). The tokens must be equal: the two implementations' logits differ by float rounding
(~1e-6), and at these seeds no step has a near-tie that rounding could flip."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import cs_run_weights_as_transformers
from test_hf_convert import FAMILIES

from cs_run.models.common.generate import GenerationConfig, generate

transformers = pytest.importorskip("transformers")

V, NEW = 61, 12
GPT2 = pytest.param("GPT2Config", "GPT2LMHeadModel", "gpt2",
                    dict(n_embd=48, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                         attn_pdrop=0.0), id="gpt2")
PROMPTS = [[5, 17, 3, 40, 22, 9, 31], [12, 1], [60, 7, 7, 29]]


@pytest.mark.parametrize("config_cls, model_cls, name, config", [GPT2, *FAMILIES])
def test_greedy_tokens_equal_transformers_generate(tmp_path, config_cls, model_cls, name, config):
    lm, hf = cs_run_weights_as_transformers(tmp_path, config_cls, model_cls, name, vocab_size=V, **config)
    hf.generation_config.eos_token_id = None  # run all NEW steps, as cs-run without eos ids
    hf.generation_config.pad_token_id = 0
    expected = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
            expected.append(out[0, len(prompt):].tolist())
    alone = [g.tokens for g in generate(lm, PROMPTS, GenerationConfig(max_new_tokens=NEW, batch_size=1))]
    batched = [g.tokens for g in generate(lm, PROMPTS, GenerationConfig(max_new_tokens=NEW))]
    assert alone == expected
    assert batched == expected
