"""LoRA (``model.lora_params``, the Model Zoo's Lora callback): forward, gradients and the folded export
equal peft's on the same base weights and adapters; only the adapters train, on CPU and CSX fx alike;
what the vendor's LoRA could not mean is one params error."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from cs_run.errors import ParamsError
from cs_run.lora_params import check_lora_params
from cs_run.models.common.lm import build_model
from cs_run.models.common.lora import LORA_SUFFIXES, apply_lora, folded_state_dict
from cs_run.params import load_params

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt2_helpers import run, tiny_shards, weights  # noqa: E402

peft = pytest.importorskip("peft")

LLAMA = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_heads=4, filter_size=64,
             max_position_embeddings=16, position_embedding_type="rotary", norm_type="rmsnorm",
             nonlinearity="swiglu", share_embedding_weights=False, use_projection_bias_in_attention=False,
             use_ffn_bias_in_attention=False, use_ffn_bias=False, dropout_rate=0.0)


def _batch(seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (2, 16), generator=generator)
    return {"input_ids": ids, "labels": torch.roll(ids, -1, 1), "attention_mask": torch.ones_like(ids)}


def _ours_and_peft(lora: dict, peft_kwargs: dict):
    """A cs-run llama with our adapters, and the same base weights under peft's with our adapter values."""
    torch.manual_seed(0)
    base = build_model(**LLAMA)
    ours = copy.deepcopy(base)
    converted = apply_lora(ours, check_lora_params(lora))
    with torch.no_grad():  # B is zero at init: give every adapter values so the update is not zero
        for name, p in ours.named_parameters():
            if name.endswith(LORA_SUFFIXES):
                p.copy_(torch.randn_like(p) * 0.1)
    config = peft.LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=0.0,
                             target_modules=converted, **peft_kwargs)
    theirs = peft.inject_adapter_in_model(config, copy.deepcopy(base))
    ours_params = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            for kind in ("A", "B"):
                for infix in (f".lora_{kind}.default.weight", f".lora_embedding_{kind}.default"):
                    if name.endswith(infix):
                        p.copy_(ours_params[name[: -len(infix)] + f".lora_{kind}"])
    return base, ours, theirs, converted


@pytest.mark.parametrize("lora", [
    {"r": 4, "alpha": 8, "target_modules": ["MultiheadAttention"]},
    {"r": 2, "alpha": 3, "target_modules": ["FeedForwardNetwork"]},
    {"r": 3, "alpha": 6, "target_modules": ["EmbeddingLayer"]},
], ids=["attention", "ffn", "embedding"])
def test_forward_gradients_and_fold_equal_peft(lora):
    base, ours, theirs, converted = _ours_and_peft(lora, {})
    assert converted
    loss_ours, loss_theirs = ours(_batch()), theirs(_batch())
    torch.testing.assert_close(loss_ours, loss_theirs, rtol=0, atol=1e-6)
    loss_ours.backward()
    loss_theirs.backward()
    theirs_grads = {n: p.grad for n, p in theirs.named_parameters() if p.requires_grad and p.grad is not None}
    checked = 0
    for name, p in ours.named_parameters():
        if name.endswith(LORA_SUFFIXES):
            stem, kind = name.rsplit(".lora_", 1)
            theirs_name = next(n for n in theirs_grads if n.startswith(stem + ".") and f"_{kind}." in n + ".")
            torch.testing.assert_close(p.grad, theirs_grads[theirs_name], rtol=0, atol=1e-6, msg=name)
            checked += 1
        else:
            assert p.grad is None and not p.requires_grad, name
    assert checked == 2 * len(converted)
    merged = theirs.merge_and_unload() if hasattr(theirs, "merge_and_unload") else _peft_merged(theirs)
    folded = folded_state_dict(ours)
    assert not any(k.endswith(LORA_SUFFIXES) for k in folded) and set(folded) == set(base.state_dict())
    for key, value in merged.state_dict().items():
        torch.testing.assert_close(folded[key], value, rtol=0, atol=1e-6, msg=key)
    plain = copy.deepcopy(base)
    plain.load_state_dict(folded)
    with torch.no_grad():
        torch.testing.assert_close(plain(_batch(1)), ours(_batch(1)), rtol=0, atol=1e-5)


def _peft_merged(model: torch.nn.Module) -> torch.nn.Module:
    """peft's own merge on a model injected without a PeftModel wrapper: each LoRA layer's merge_and_unload."""
    from peft.tuners.lora import LoraLayer  # noqa: PLC0415 (peft is a test reference, imported with it)
    for name, module in list(model.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, module.get_base_layer())
    return model


def test_the_adapters_keep_the_layer_weight_parameter_so_ties_hold():
    torch.manual_seed(0)
    model = build_model(**{**LLAMA, "share_embedding_weights": True})
    head = model.model.lm_head.weight
    assert head is model.model.embedding_layer.word_embeddings.weight
    apply_lora(model, check_lora_params({"r": 2, "alpha": 2, "target_modules": ["EmbeddingLayer"]}))
    embedding = model.model.embedding_layer.word_embeddings
    assert type(embedding).__name__ == "LoRAEmbedding" and embedding.weight is head is model.model.lm_head.weight
    assert not head.requires_grad


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("lora_shards"))


LORA = {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["TransformerDecoderLayer", "Linear"]}


def test_only_the_adapters_train_and_csx_fx_equals_cpu_bit_for_bit(tmp_path, shards):
    model = {"lora_params": LORA, "dropout_rate": 0.1}
    runconfig = {"max_steps": 6, "checkpoint_steps": 6}
    start, _ = run(tmp_path, shards, "CPU", "start", mode="train", model=model, runconfig={"max_steps": 1})
    cpu, _ = run(tmp_path, shards, "CPU", "cpu", mode="train", model=model, runconfig=runconfig)
    csx, _ = run(tmp_path, shards, "CSX", "csx", mode="train", model=model, runconfig={**runconfig, "compile_tier": "fx"})
    before, after = weights(start), weights(cpu)
    adapters = [k for k in after if k.endswith(LORA_SUFFIXES)]
    assert len(adapters) == 2 * 2 * 6  # 2 layers x (q, k, v, output, ffn in, ffn out) x (A, B)
    for key, value in after.items():
        if key.endswith(".lora_B"):
            assert not torch.equal(value, torch.zeros_like(value)), key  # B starts at zero and has trained
        elif not key.endswith(".lora_A"):
            assert torch.equal(value, before[key]), f"{key} is frozen but changed"
    for key, value in after.items():
        assert torch.equal(value, weights(csx)[key]), key
    from cs_run.checkpoint import load  # noqa: PLC0415 (h5py loads where used)
    saved = load(str(tmp_path / "cpu" / "checkpoint_6.mdl"))["model"]
    assert set(adapters) <= set(saved)


def test_the_trainer_form_lora_callback_is_model_lora_params(tmp_path):
    legacy = tmp_path / "legacy.yaml"
    legacy.write_text("model:\n  name: gpt2\n  vocab_size: 64\n  lora_params:\n    r: 4\n    alpha: 8\n")
    trainer = tmp_path / "trainer.yaml"
    trainer.write_text("trainer:\n  init:\n    model:\n      name: gpt2\n      vocab_size: 64\n"
                       "    callbacks:\n    - Lora:\n        lora_params:\n          r: 4\n          alpha: 8\n")
    assert load_params(trainer).model.lora_params == load_params(legacy).model.lora_params == {"r": 4, "alpha": 8}


@pytest.mark.parametrize("lora, message", [
    ({"r": 0}, r"model.lora_params.r: the adapter rank must be a whole number >= 1, got 0"),
    ({"r": 2.5}, r"model.lora_params.r: the adapter rank must be a whole number >= 1, got 2.5"),
    ({"r": True}, r"model.lora_params.r: the adapter rank"),
    ({"r": 4, "alpha": 0}, r"model.lora_params.alpha: must be a number > 0"),
    ({"r": 4, "alpha": "8"}, r"model.lora_params.alpha: must be a number > 0"),
    ({"r": 4, "dropout": 1.0}, r"model.lora_params.dropout: must be a probability in \[0, 1\)"),
    ({"r": 4, "dropout": -0.1}, r"model.lora_params.dropout: must be a probability"),
    ({"r": 4, "fan_in_fan_out": True}, r"model.lora_params.fan_in_fan_out: true is not supported"),
    ({"r": 4, "merge_weights": "yes"}, r"model.lora_params.merge_weights: must be true or false"),
    ({"r": 4, "target_modules": []}, r"model.lora_params.target_modules: expected a non-empty list"),
    ({"r": 4, "target_modules": "Linear"}, r"model.lora_params.target_modules: expected a non-empty list"),
    ({"r": 4, "target_modules": [1]}, r"model.lora_params.target_modules: expected a non-empty list"),
    ({"r": 4, "apha": 4}, r"unknown key model.lora_params.apha; did you mean 'alpha'\?"),
    ([], r"model.lora_params: an empty list converts no layer"),
    ([{"r": 4}, 5], r"model.lora_params\[1\]: expected a mapping"),
    ("r4", r"model.lora_params: expected a mapping"),
])
def test_what_the_vendor_lora_could_not_mean_is_one_params_error(tmp_path, lora, message):
    import yaml  # noqa: PLC0415
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"model": {"name": "gpt2", "vocab_size": 64, "lora_params": lora}}))
    with pytest.raises(ParamsError, match=message) as info:
        load_params(path)
    assert "\n" not in str(info.value)


def test_a_target_no_layer_of_the_model_is_inside_names_the_classes_it_has():
    model = build_model(**LLAMA)
    with pytest.raises(ParamsError, match=r"no Linear or Embedding layer of the model is inside Attention; "
                                          r"target_modules names module classes, and this model has: .*MultiheadAttention"):
        apply_lora(model, check_lora_params({"r": 2, "target_modules": ["Attention"]}))


def test_the_first_matching_config_wins_per_layer():
    model = build_model(**LLAMA)
    configs = check_lora_params([{"r": 2, "alpha": 2, "target_modules": ["MultiheadAttention"]},
                                 {"r": 3, "alpha": 3}])
    apply_lora(model, configs)
    attention = model.model.transformer_decoder.layers[0].self_attn.proj_q_dense_layer
    assert attention.lora_A.shape[0] == 2
    ffn = [m for n, m in model.named_modules() if n.endswith("ffn.ffn.0.linear_layer")]
    assert ffn and ffn[0].lora_A.shape[0] == 3


def test_a_lora_run_starts_from_its_base_models_checkpoint_with_fresh_adapters(tmp_path, shards, caplog):
    """Fine-tuning a pretrained model: the base checkpoint has no adapters; its weights load, the adapters start
    from their initialisation (B = 0), and the frozen weights end the run equal to the checkpoint's."""
    import logging  # noqa: PLC0415

    base, _ = run(tmp_path, shards, "CPU", "base", mode="train", runconfig={"max_steps": 2, "checkpoint_steps": 2})
    start = tmp_path / "base" / "checkpoint_2.mdl"
    caplog.set_level(logging.INFO, logger="cs_run.runners")
    tuned, _ = run(tmp_path, shards, "CPU", "tuned", mode="train", model={"lora_params": LORA},
                   runconfig={"max_steps": 3, "checkpoint_path": str(start)})
    assert any("the start checkpoint holds no adapters" in r.getMessage() for r in caplog.records)
    for key, value in weights(tuned).items():
        if key.endswith(".lora_B"):
            assert not torch.equal(value, torch.zeros_like(value)), key
        elif not key.endswith(".lora_A"):
            assert torch.equal(value, weights(base)[key]), key
    from cs_run.checkpoint import load, save  # noqa: PLC0415
    state = load(str(tmp_path / "tuned" / "checkpoint_3.mdl"))
    some = {k: v for k, v in state["model"].items() if not k.endswith(".lora_B")}  # adapters half there
    save({"model": some}, str(tmp_path / "half.mdl"))
    with pytest.raises(Exception, match=r"lora_B"):
        run(tmp_path, shards, "CPU", "half", mode="train", model={"lora_params": LORA},
            runconfig={"max_steps": 3, "checkpoint_path": str(tmp_path / "half.mdl")})


@pytest.mark.parametrize("targets", [["MultiheadAttention"], ["EmbeddingLayer"]], ids=["attention", "tied-embedding"])
def test_convert_to_hf_folds_the_adapters_and_transformers_computes_the_lora_models_logits(tmp_path, shards, targets):
    """The vendor's fold_lora_checkpoint, as the --to hf export: transformers on the folder computes what the
    LoRA model computed. gpt2 ties its LM head to the embedding: an adapted embedding unties them."""
    transformers = pytest.importorskip("transformers")
    from click.testing import CliRunner  # noqa: PLC0415

    from cs_run.frontends.checkpoint_cli import checkpoint as checkpoint_cli  # noqa: PLC0415

    lora = {"r": 2, "alpha": 4, "target_modules": targets}
    tuned, _ = run(tmp_path, shards, "CPU", "tuned", mode="train", model={"lora_params": lora, "dropout_rate": 0.0},
                   runconfig={"max_steps": 3, "checkpoint_steps": 3})
    result = CliRunner().invoke(checkpoint_cli, ["convert", "--to", "hf", str(tmp_path / "tuned" / "checkpoint_3.mdl"),
                                                 str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    tuned.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, tuned.model.model(ids), rtol=1e-5, atol=1e-5)
    assert hf.config.tie_word_embeddings is (targets != ["EmbeddingLayer"])
    from cs_run.frontends.generate_cli import load_decoder  # noqa: PLC0415 (generate and lm-eval build it so)
    lm, _ = load_decoder(tmp_path / "tuned" / "params_resolved.yaml", tmp_path / "tuned" / "checkpoint_3.mdl")
    with torch.no_grad():
        torch.testing.assert_close(lm(ids), tuned.model.model(ids), rtol=1e-5, atol=1e-5)
