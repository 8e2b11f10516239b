"""The Release 2.10 transformer params files (transformer_base, transformer_large: the vendor's T5 code with
fixed positions, post-norm, FFN biases, the Transformer's initializers and scaled attention), shrunk by
tools/modelzoo_files.py over parallel text in the vendor's layout: validate-only, 5 training steps on CPU and 5
on CSX fx (float16 autocast, as the files ask: losses within 1e-3 relative, see the test), and the first
batch's logits within 1e-5 of torch.nn.Transformer with the same weights (no dropout for that run) and its loss
the vendor's rule by hand from those logits
(batch_size, or precomputed_num_masked without a batch loss_weight: masked sum / batch * lm_loss_weight)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hf_helpers import TOL, build
from modelzoo_file_helpers import in_process_every_step, mz, needs_mirror, shrunk, train_on_cpu_and_csx, write

from cs_run.data.processors.t5 import build_dataloader
from tests.modelzoo_marks import first_in_suite_rest_in_sweep

FILES = ["transformer_base", "transformer_large"]
pytestmark = needs_mirror


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("parallel_text")
    mz.write_transformer_text(out)
    return out


def _shrunk(name: str, data: Path, tmp_path: Path) -> dict:
    return shrunk(f"src/cerebras/modelzoo/models/nlp/transformer/configs/{name}.yaml", data, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", first_in_suite_rest_in_sweep(FILES))
def test_file_validates_and_trains_5_steps_on_cpu_and_csx(tmp_path, data, name):
    path = write(in_process_every_step(_shrunk(name, data, tmp_path)), tmp_path / "p.yaml")
    cpu, csx = train_on_cpu_and_csx(path, tmp_path)
    assert [step for step, _ in cpu] == [1, 2, 3, 4, 5] and all(np.isfinite(loss) for _, loss in cpu)
    # float16 autocast (the files' precision, no fp16_type): CPU eager and the CSX fx tier differ by ~3e-5
    # relative at step 1 (2.717008 vs 2.717092 on transformer_base), ~4e-4 by step 5; with precision off they
    # are bit-identical (measured): the difference is in the float16 path, an open question for the engine
    assert [s for s, _ in csx] == [1, 2, 3, 4, 5]
    assert cpu[0][1] == pytest.approx(csx[0][1], rel=1e-4)
    for (_, a), (_, b) in zip(cpu, csx):
        assert a == pytest.approx(b, rel=1e-3)


def _torch_transformer(sd: dict, keys: dict) -> torch.nn.Transformer:
    """torch's post-norm Transformer holding the model's weights (the q/k/v projections fused, zero biases
    where the vendor has none)."""
    d, h = keys["d_model"], keys["num_heads"]
    ref = torch.nn.Transformer(d, h, keys["encoder_num_hidden_layers"], keys["decoder_num_hidden_layers"],
                               keys["d_ff"], dropout=0.0, activation="relu", batch_first=True, norm_first=False,
                               layer_norm_eps=keys["layer_norm_epsilon"]).eval()
    out = {}
    for stack, n in (("encoder", keys["encoder_num_hidden_layers"]), ("decoder", keys["decoder_num_hidden_layers"])):
        for i in range(n):
            ours, theirs = f"model.{stack}.layers.{i}.", f"{stack}.layers.{i}."
            for attn in ("self_attn", "multihead_attn") if stack == "decoder" else ("self_attn",):
                qkv = [sd[f"{ours}{attn}.proj_{x}_dense_layer.weight"] for x in "qkv"]
                out[f"{theirs}{attn}.in_proj_weight"] = torch.cat(qkv)
                out[f"{theirs}{attn}.in_proj_bias"] = torch.zeros(3 * d)
                out[f"{theirs}{attn}.out_proj.weight"] = sd[f"{ours}{attn}.proj_output_dense_layer.weight"]
                out[f"{theirs}{attn}.out_proj.bias"] = torch.zeros(d)
            for j, lin in ((0, "linear1"), (1, "linear2")):
                for kind in ("weight", "bias"):
                    out[f"{theirs}{lin}.{kind}"] = sd[f"{ours}ffn.ffn.{j}.linear_layer.{kind}"]
            for k in (1, 2, 3) if stack == "decoder" else (1, 2):
                for kind in ("weight", "bias"):
                    out[f"{theirs}norm{k}.{kind}"] = sd[f"{ours}norm{k}.{kind}"]
        for kind in ("weight", "bias"):
            out[f"{stack}.norm.{kind}"] = sd[f"model.{stack}.norm.{kind}"]
    ref.load_state_dict(out)
    return ref


@pytest.mark.parametrize("name", FILES)
def test_first_loss_is_torch_transformers_with_the_same_weights(tmp_path, data, name):
    trainer = _shrunk(name, data, tmp_path)["trainer"]
    keys = {**trainer["init"]["model"], "dropout_rate": 0.0, "relu_dropout_rate": 0.0}
    assert keys["use_transformer_initialization"] and keys["position_embedding_type"] == "fixed"
    section = {**trainer["fit"]["train_dataloader"], "num_workers": 0}
    torch.manual_seed(1)
    model = build(keys)
    batch = next(iter(build_dataloader("train", **section)))
    with torch.no_grad():
        ours = model(dict(batch)).item()
        logits = model.model(batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"])
    sd = model.state_dict()
    emb = sd["model.encoder_embeddings.word_embeddings.weight"]
    table = model.model.encoder_embeddings.position_embeddings.fpe  # the sin-cos table both sides add
    src, tgt = batch["input_ids"].long(), batch["decoder_input_ids"].long()
    ref = _torch_transformer(sd, keys)
    pad = batch["attention_mask"] == 0
    causal = torch.nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
    with torch.no_grad():
        out = ref(emb[src] + table[:src.shape[1]], emb[tgt] + table[:tgt.shape[1]], tgt_mask=causal,
                  src_key_padding_mask=pad, memory_key_padding_mask=pad)
    expected_logits = (out * keys["d_model"] ** -0.5) @ emb.T
    torch.testing.assert_close(logits, expected_logits, **TOL)
    ce = F.cross_entropy(expected_logits.reshape(-1, emb.shape[0]), batch["labels"].reshape(-1).long(),
                         reduction="none")
    expected = (ce * batch["decoder_attention_mask"].reshape(-1)).sum() / src.shape[0] * keys["lm_loss_weight"]
    # base: precomputed_num_masked without a batch loss_weight falls back to batch_size; large: batch_size
    assert keys.get("mlm_loss_scaling", "batch_size") in ("precomputed_num_masked", "batch_size")
    assert "loss_weight" not in batch
    assert ours == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
