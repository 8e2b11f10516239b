"""Generation benchmark: tokens per second of cs-run's KV-cached ``generate`` and transformers' ``generate``
on the same weights (a Llama of the given size with random weights, exported by ``--to hf``), greedy, float32.

Each repeat runs both, in alternating order, on the same prompts; the report is the median over the repeats
of the new tokens per second (the prefill included, as a user waits for it), and cs-run's ratio to
transformers. Both stop only at max_new_tokens (no eos). The CPU model (lscpu) and thread count are printed.

Run: ``flock /tmp/cs-run-heavy.lock .venv/bin/python bench/bench_generate.py [--quick]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers
from machine_info import cpu_name

from cs_run.checkpoint import save
from cs_run.models.common.generate import GenerationConfig, generate
from cs_run.models.common.hf import build
from cs_run.registry import hf_converter


def models(folder: Path, hidden: int, layers: int, vocab: int):
    keys = dict(name="llama", vocab_size=vocab, hidden_size=hidden, num_heads=hidden // 64, num_hidden_layers=layers,
                filter_size=hidden * 8 // 3 // 8 * 8, max_position_embeddings=1024, position_embedding_type="rotary",
                rotary_dim=64, norm_type="rmsnorm", nonlinearity="swiglu", dropout_rate=0.0,
                use_projection_bias_in_attention=False, use_ffn_bias_in_attention=False, use_ffn_bias=False,
                share_embedding_weights=False, attention_module="multiquery_attention",
                extra_attention_params={"num_kv_groups": max(hidden // 256, 1)})
    torch.manual_seed(0)
    model = build(keys)
    save({"model": model.state_dict()}, str(folder / "model.mdl"))
    hf_converter("llama", "bench").to_hf(folder / "model.mdl", folder / "hf", keys)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder / "hf"), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return model.model.eval(), hf


def run_ours(lm, prompts, new: int) -> float:
    start = time.perf_counter()
    out = generate(lm, prompts, GenerationConfig(max_new_tokens=new))
    elapsed = time.perf_counter() - start
    assert all(len(g.tokens) == new for g in out)
    return new * len(prompts) / elapsed


@torch.no_grad()
def run_hf(hf, prompts, new: int) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False)
    elapsed = time.perf_counter() - start
    assert out.shape[1] == width + new
    return new * len(prompts) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model and 3 repeats")
    args = parser.parse_args()
    hidden, layers, vocab, repeats = (256, 2, 8000, 3) if args.quick else (512, 4, 32000, 9)
    print(f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"transformers {transformers.__version__}; Llama hidden {hidden}, {layers} layers, vocab {vocab}, float32")
    with tempfile.TemporaryDirectory() as tmp:
        lm, hf = models(Path(tmp), hidden, layers, vocab)
    g = torch.Generator().manual_seed(1)
    print(f"{'workload':<34} {'cs-run tok/s':>13} {'transformers':>13} {'ratio':>7}")
    for batch, prompt, new in ((1, 32, 64), (4, 32, 64), (1, 256, 32)):
        lengths = [prompt - 5 * i for i in range(batch)]  # unequal: the batch is left-padded
        prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
        run_ours(lm, prompts, 4), run_hf(hf, prompts, 4)  # warm-up
        ours, theirs = [], []
        for r in range(repeats):
            pair = ((ours, run_ours, lm), (theirs, run_hf, hf))
            for results, fn, model in (pair if r % 2 == 0 else pair[::-1]):
                results.append(fn(model, prompts, new))
        a, b = statistics.median(ours), statistics.median(theirs)
        name = f"batch {batch}, prompt {prompt}, {new} new"
        print(f"{name:<34} {a:>13.1f} {b:>13.1f} {a / b:>7.2f}")


if __name__ == "__main__":
    main()
