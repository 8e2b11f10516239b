"""The dpo family (model.name ``dpo``) and DpoHDF5DataProcessor: the vendor's loss types equal trl's DPO loss
(sigmoid, hinge, ipo; dpop and reference_free by the formulas of Release_2.10.0 ``losses/DPOLoss.py``) on the
same log-probabilities; a tiny copy of Release_2.10.0's dpo params file trains 10 steps through ``cs-run``
with losses, summaries and eval metrics equal to a hand computation (eager PyTorch log-softmax under the
loss mask, trl's loss) on CPU and CSX fx; checkpoints hold the policy and its frozen reference as the
vendor's do; bad DPO input is one Error line."""

from __future__ import annotations

import math
import re
import shutil
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cs_run.frontends.cli import cli
from cs_run.models.common.lm import build_model as build_decoder
from cs_run.models.dpo.loss import DPOLoss
from cs_run.models.dpo.model import model_defaults
from cs_run.summaries import read_scalars

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dpo_helpers import encode_pair, write_dpo_shards  # noqa: E402

PARAMS = Path(__file__).resolve().parent / "dpo_tiny.yaml"
POLICY = dict(vocab_size=64, hidden_size=32, position_embedding_type="rotary", rotary_dim=8,
              share_embedding_weights=False, max_position_embeddings=32, embedding_dropout_rate=0.0,
              num_hidden_layers=2, dropout_rate=0.0, layer_norm_epsilon=1.0e-05, norm_type="rmsnorm", num_heads=4,
              attention_type="scaled_dot_product", attention_module="multiquery_attention",
              extra_attention_params={"num_kv_groups": 2}, attention_dropout_rate=0.0,
              use_projection_bias_in_attention=False, use_ffn_bias_in_attention=False,
              attention_sliding_window_length=8, filter_size=64, nonlinearity="swiglu", use_ffn_bias=False,
              use_bias_in_output=False)
"""dpo_tiny.yaml's policy_model (mistral) keys but its name."""


# ----------------------------------------------------------------------------------------------- the loss


def _trl_loss(loss_type: str, beta: float, pc, pr, rc, rr, chosen_len, rejected_len) -> float:
    """trl's DPOTrainer loss (trl 1.16 ``_compute_loss``) on given summed log-probs: its method run with the
    attributes it reads, a stand-in model whose per-token log-probs sum to ``pc``/``pr`` and the reference's
    log-probs given as precomputed (``ref_chosen_logps``), as trl takes them with ``precompute_ref_logps``."""
    DPOTrainer = pytest.importorskip("trl").DPOTrainer  # noqa: N806 (the test extra's reference, as peft is)

    b, length = pc.shape[0], 12
    completion = torch.zeros(2 * b, length, dtype=pc.dtype)
    per_token = torch.zeros(2 * b, length - 1, dtype=pc.dtype)
    for i, (logps, n) in enumerate([*zip(pc, chosen_len), *zip(pr, rejected_len)]):
        completion[i, 1:1 + n] = 1  # position 0 is the prompt: the shifted mask counts the same tokens
        per_token[i, :n] = logps / n  # sums to logps over the completion's tokens

    def model(**kwargs):
        zeros = torch.zeros_like(per_token)
        return SimpleNamespace(log_probs=per_token, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())

    accelerator = SimpleNamespace(device=torch.device("cpu"), gather=lambda x: x, gather_for_metrics=lambda x: x)
    trainer = SimpleNamespace(model=SimpleNamespace(training=True), accelerator=accelerator, aux_loss_enabled=False,
                              ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl", beta=beta,
                              loss_types=[loss_type], loss_weights=[1.0], label_smoothing=0.0, use_weighting=False,
                              _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": torch.ones(2 * b, length, dtype=torch.long), "attention_mask": torch.ones(2 * b, length),
              "completion_mask": completion, "ref_chosen_logps": rc, "ref_rejected_logps": rr}
    return float(DPOTrainer._compute_loss(trainer, model, inputs, False))


def _logps(seed: int, b: int = 5):
    g = torch.Generator().manual_seed(seed)
    pc, pr, rc, rr = (-20 * torch.rand(b, generator=g, dtype=torch.float64) - 1 for _ in range(4))
    lengths = [torch.randint(1, 11, (b,), generator=g) for _ in range(2)]
    return pc, pr, rc, rr, *lengths


@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge", "ipo"])
@pytest.mark.parametrize("beta", [0.01, 0.1, 0.5])
def test_each_loss_type_trl_implements_equals_trls_loss(loss_type, beta):
    pc, pr, rc, rr, lc, lr = _logps(int(beta * 100))
    ours = DPOLoss(beta=beta, loss_type=loss_type)
    if loss_type == "ipo":  # the vendor's model averages each answer's log-probs over its tokens for ipo
        got = ours(pc / lc, pr / lr, rc / lc, rr / lr)
    else:
        got = ours(pc, pr, rc, rr)
    assert abs(float(got) - _trl_loss(loss_type, beta, pc, pr, rc, rr, lc, lr)) < 1e-6


def test_dpop_and_reference_free_follow_the_vendors_formulas_by_hand():
    """trl has no dpop; the vendor's (DPOP, Pal et al. 2024 eq. 3): -log sigmoid(beta * (logits - lambda *
    max(0, rc - pc))); reference_free takes logits = pc - pr."""
    pc, pr, rc, rr, _, _ = _logps(7)
    beta, lam = 0.1, 5.0
    dpop = [-math.log(1 / (1 + math.exp(-beta * ((a - b) - (c - d) - lam * max(0.0, c - a)))))
            for a, b, c, d in zip(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist())]
    free = [-math.log(1 / (1 + math.exp(-beta * (a - b)))) for a, b in zip(pc.tolist(), pr.tolist())]
    assert abs(float(DPOLoss(beta, "dpop", dpop_penalty_weight=lam)(pc, pr, rc, rr)) - sum(dpop) / 5) < 1e-12
    assert abs(float(DPOLoss(beta, "sigmoid", reference_free=True)(pc, pr, None, None)) - sum(free) / 5) < 1e-12
    assert any(c > a for a, c in zip(pc.tolist(), rc.tolist()))  # the penalty is exercised


# ----------------------------------------------------------------------------------------------- the data


def test_the_processor_reads_the_token_generators_rows_and_labels_are_the_shifted_tokens(tmp_path):
    """The shards are the vendor's layout (Release_2.10.0 data_preparation/data_preprocessing/dpo_token_generator.py
    lines 428-501, see dpo_helpers); one pair is checked against that generator's rule written out by hand."""
    from cs_run.data.processors.dpo import FEATURES, build_dataloader  # noqa: PLC0415 (h5py loads with it)

    write_dpo_shards(tmp_path / "train", pairs=3, seed=4)
    batch = next(iter(build_dataloader("train", str(tmp_path / "train"), batch_size=3, shuffle=False)))
    assert list(batch) == list(FEATURES) and all(v.dtype == torch.int32 and v.shape == (3, 16) for v in batch.values())
    sample = encode_pair([5, 6, 7], [8, 9], [10, 11, 12], 8)
    assert sample.tolist() == [[5, 6, 7, 8, 9, 0, 0, 0], [0, 0, 1, 1, 1, 0, 0, 0], [0, 0, 8, 9, 0, 0, 0, 0],
                               [5, 6, 7, 10, 11, 12, 0, 0], [0, 0, 1, 1, 1, 1, 0, 0], [0, 0, 10, 11, 12, 0, 0, 0]]
    for side in ("chosen", "rejected"):  # the masked labels are the next tokens (and one pad, as the vendor's)
        ids, labels, mask = (batch[f"{side}_{k}"] for k in ("input_ids", "labels", "attention_mask"))
        on = mask.bool()
        assert torch.equal(labels[:, :-1][on[:, :-1]], torch.where(on, torch.roll(ids, -1, 1), 0)[:, :-1][on[:, :-1]])


def _shard(path: Path, data: np.ndarray, **attrs) -> None:
    import h5py  # noqa: PLC0415

    path.mkdir(parents=True, exist_ok=True)
    with h5py.File(path / "data-0.h5", "w") as f:
        f.create_dataset("data", data=data)
        f.attrs.update(attrs)


GOOD = np.stack([encode_pair([1, 2, 3], [4, 5], [6], 8)] * 4).astype(np.int32)
BAD_DATA = [
    ("gpt_layout", GOOD[:, :3], {}, {}, r"data_dir: .*'data' is int32\[4, 3, 8\]; expected integers of shape "
                                       r"\[n_examples, 6, max_sequence_length\]"),
    ("features_list", GOOD, {}, {"features_list": ["input_ids", "attention_mask", "labels", "a", "b", "c"]},
     r"features_list: the shards' rows .* lack chosen_input_ids"),
    ("n_examples", GOOD, {"n_examples": 9}, {}, r"attribute n_examples=9 but 'data' holds 4 rows"),
    ("vocab", GOOD, {}, {"vocab_size": 5}, r"sample 0 holds token id 5 in chosen_input_ids \(position 4\)"),
    ("batch", GOOD, {}, {"batch_size": 8}, r"batch_size: 8 per streamer but the train shards hold 4 pairs"),
    ("processor", GOOD, {}, {"data_processor": "GptHDF5DataProcessor"}, r"data_processor: 'GptHDF5DataProcessor' is "
                                                                          r"not a DPO data processor"),
]


@pytest.mark.parametrize("name, data, attrs, keys, message", BAD_DATA, ids=[row[0] for row in BAD_DATA])
def test_bad_dpo_shards_name_the_key_and_the_fix(tmp_path, name, data, attrs, keys, message):
    from cs_run.data.processors.dpo import build_dataloader  # noqa: PLC0415
    from cs_run.errors import DataError  # noqa: PLC0415

    _shard(tmp_path / "train", data, **attrs)
    keys = {"batch_size": 4, "shuffle": False, **keys}
    with pytest.raises((ValueError, DataError), match=message):
        next(iter(build_dataloader("train", str(tmp_path / "train"), **keys)))


# ----------------------------------------------------------------------------------------------- the recipe


def _cs_run(*args) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """dpo_tiny.yaml's shards beside a copy of it (its data paths are relative), trained 10 steps with an eval
    on CPU, with a checkpoint every step (checkpoint_0 is the initial weights)."""
    root = tmp_path_factory.mktemp("dpo_recipe")
    write_dpo_shards(root / "dpo_shards" / "train", pairs=4, seed=0)
    write_dpo_shards(root / "dpo_shards" / "test", pairs=4, seed=1)
    shutil.copy(PARAMS, root / "params.yaml")
    return root


def _train(root: Path, name: str, *extra) -> Path:
    import os  # noqa: PLC0415

    here = os.getcwd()
    os.chdir(root)  # the params' data_dir is ./dpo_shards/..., relative to the run's folder as the vendor's
    try:
        result = _cs_run("train-and-eval", "-p", root / "params.yaml", "--model_dir", root / name,
                         "--set", "train_input.num_workers=0", "--set", "eval_input.num_workers=0",
                         "--set", "runconfig.checkpoint_steps=1", "--set", "runconfig.save_initial_checkpoint=true",
                         *extra)
    finally:
        os.chdir(here)
    assert result.exit_code == 0, result.output
    return root / name


def _hand(checkpoint: Path, batch: dict, beta: float = 0.01) -> dict:
    """By eager PyTorch from a checkpoint's two weight sets: each answer's log-prob (log-softmax of the logits
    at the label tokens, summed under the loss mask), the rewards, and trl's sigmoid loss on them. The logits
    are the decoder's under the run's bfloat16 autocast (its CPU precision for fp16_type cbfloat16)."""
    from cs_run.checkpoint import load  # noqa: PLC0415 (h5py loads where used)

    state = load(str(checkpoint))["model"]
    out = {}
    for role in ("policy_model", "ref_model"):
        lm = build_decoder(**POLICY).eval()
        lm.load_state_dict({k[len(role) + 1:]: v for k, v in state.items() if k.startswith(role + ".")})
        for side in ("chosen", "rejected"):
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                logits = lm.model(batch[f"{side}_input_ids"])
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            picked = logprobs.gather(-1, batch[f"{side}_labels"].long().unsqueeze(-1)).squeeze(-1)
            out[f"{role}/{side}"] = (picked * batch[f"{side}_attention_mask"].float()).sum(-1)
    pc, pr, rc, rr = (out[k].double() for k in ("policy_model/chosen", "policy_model/rejected", "ref_model/chosen",
                                                  "ref_model/rejected"))
    ones = torch.ones_like(pc, dtype=torch.long)
    chosen, rejected = beta * (pc - rc), beta * (pr - rr)
    return {"loss": _trl_loss("sigmoid", beta, pc, pr, rc, rr, ones, ones), "policy_chosen_logps": float(pc.mean()),
            "policy_rejected_logps": float(pr.mean()), "chosen_rewards": float(chosen.mean()),
            "rejected_rewards": float(rejected.mean()), "reward_margins": float((chosen - rejected).mean()),
            "reward_accuracies": float((chosen > rejected).double().mean())}


def _batch(folder: Path) -> dict:
    from cs_run.data.processors.dpo import build_dataloader  # noqa: PLC0415

    return next(iter(build_dataloader("train", str(folder), batch_size=4, shuffle=False)))


def test_the_release_dpo_params_train_10_steps_as_computed_by_hand(recipe):
    """Every pair of the shard is in each batch (4 pairs, batch 4): the fixed batch's loss and summaries at
    step k+1 are those of checkpoint_k's policy and reference, by hand, within 1e-6 (the first is ln 2: the
    reference is the policy's copy)."""
    from cs_run.utils.tensorboard import summarize_scalar  # noqa: PLC0415

    summarize_scalar("stale_scalar", 1.0)  # summarized before the run (another model's forward): not the run's
    model_dir = _train(recipe, "cpu")
    train = read_scalars(model_dir / "train")
    assert "stale_scalar" not in train
    losses = [v for _, v in train["loss"]]
    assert len(losses) == 10 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0] and abs(losses[0] - math.log(2)) < 1e-6
    batch = _batch(recipe / "dpo_shards" / "train")
    for step in (1, 2, 10):
        hand = _hand(model_dir / f"checkpoint_{step - 1}.mdl", batch)
        for tag, value in hand.items():
            logged = dict(train[tag])[step]
            assert abs(logged - value) < 1e-6 * max(1.0, abs(value)), (step, tag, logged, value)
    assert dict(train["reward_accuracies"])[10] == 1.0 and dict(train["reward_margins"])[10] > 0  # it learned
    # the eval at step 10: the vendor's eval metric names, the means over the eval batch, by hand
    evals = read_scalars(model_dir / "eval")
    hand = _hand(model_dir / "checkpoint_10.mdl", _batch(recipe / "dpo_shards" / "test"))
    for name, tag in (("rewards_chosen", "chosen_rewards"), ("rewards_rejected", "rejected_rewards"),
                      ("rewards_accuracies", "reward_accuracies"), ("rewards_margins", "reward_margins"),
                      ("logps_chosen", "policy_chosen_logps"), ("logps_rejected", "policy_rejected_logps")):
        assert abs(dict(evals[name])[10] - hand[tag]) < 1e-6 * max(1.0, abs(hand[tag])), name
    assert abs(dict(evals["loss"])[10] - hand["loss"]) < 1e-6


def test_checkpoints_hold_the_trained_policy_and_the_frozen_reference_as_the_vendors(recipe):
    """The vendor's DPO checkpoints hold ``policy_model.*`` and ``ref_model.*`` (its converter, Release_2.10.0
    tools/checkpoint_converters/dpo.py, writes both from HF weights and drops ref_model going back): the
    reference is saved so a resumed run keeps its first reference, not a copy of the trained policy."""
    from cs_run.checkpoint import load  # noqa: PLC0415

    model_dir = recipe / "cpu"
    if not (model_dir / "checkpoint_10.mdl").exists():
        _train(recipe, "cpu")
    first, last = (load(str(model_dir / f"checkpoint_{s}.mdl")) for s in (0, 10))
    policy = sorted(k for k in last["model"] if k.startswith("policy_model."))
    ref = sorted(k for k in last["model"] if k.startswith("ref_model."))
    assert len(policy) == len(ref) == len(last["model"]) / 2 and [k[6:] for k in policy] == [k[3:] for k in ref]
    for key in ref:
        assert torch.equal(last["model"][key], first["model"]["policy_model" + key[len("ref_model"):]]), key
    assert any(not torch.equal(last["model"][k], first["model"][k]) for k in policy)
    # started from checkpoint_10 (the file's LoadCheckpointStates loads its model only, at step 0, as the vendor's
    # start from an SFT checkpoint): the reference is checkpoint_10's, the initial policy, not the trained policy
    started = _train(recipe, "from_10", "--checkpoint_path", model_dir / "checkpoint_10.mdl", "--max_steps", 2)
    again = load(str(started / "checkpoint_2.mdl"))["model"]
    assert all(torch.equal(again[k], last["model"][k]) for k in ref)
    assert any(not torch.equal(again[k], last["model"][k]) for k in policy)


def test_csx_fx_trains_the_release_params_as_the_cpu(recipe):
    model_dir = recipe / "cpu"
    if not (model_dir / "checkpoint_10.mdl").exists():
        _train(recipe, "cpu")
    csx = _train(recipe, "csx", "--device", "CSX", "--set", "runconfig.compile_tier=fx", "--max_steps", 10)
    cpu_scalars, csx_scalars = read_scalars(model_dir / "train"), read_scalars(csx / "train")
    for tag in ("loss", "chosen_rewards", "reward_margins", "policy_chosen_logps"):
        cpu_values = dict(cpu_scalars[tag])
        for step, value in csx_scalars[tag]:
            assert abs(value - cpu_values[step]) < 1e-6 * max(1.0, abs(value)), (tag, step)


# ----------------------------------------------------------------------------------------------- params


def test_the_flat_pre_policy_model_form_is_nested_as_the_vendors_validator_does():
    model = {"name": "dpo", "dpo": {"beta": 0.1}, "model_name": "llama", "hidden_size": 8, "compute_eval_metrics": False}
    with pytest.warns(UserWarning, match="policy_model"):
        model_defaults(model)
    assert model == {"name": "dpo", "dpo": {"beta": 0.1}, "compute_eval_metrics": False,
                     "policy_model": {"name": "llama", "hidden_size": 8}}


BAD_PARAMS = [
    ("loss_type", "model.dpo.loss_type=kto", r"params: model\.dpo\.loss_type: expected one of 'sigmoid', 'hinge', "
                                             r"'ipo', 'dpop', got str 'kto' \(set on the command line\)"),
    ("unknown_dpo_key", "model.dpo.label_smoothing=0.1", r"params: unknown key model\.dpo\.label_smoothing; valid keys: "
                                                         r"beta, disable_dropout"),
    ("beta", "model.dpo.beta=0", r"params: model: dpo\.beta: must be > 0, got 0"),
    ("dpop_free", "model.dpo.reference_free=true --set model.dpo.loss_type=dpop", r"params: model: dpo\.loss_type: dpop "
                                                                                  r".*reference_free: false"),
    ("policy_family", "model.policy_model.name=fc_mnist", r"params: model: policy_model\.name: 'fc_mnist' is not a "
                                                          r"decoder language model; DPO trains one of bloom, .*mistral"),
    ("policy_key", "model.policy_model.hidden_sise=8", r"params: unknown key model\.policy_model\.hidden_sise; did you "
                                                       r"mean 'hidden_size'\?"),
    ("policy_value", "model.policy_model.num_heads=5", r"params: model: policy_model\.hidden_size: 32 is not divisible by "
                                                      r"num_heads \(5\) \(.*params\.yaml:21\)"),
    ("no_dpo", "model.dpo=null", r"params: missing required key model\.dpo \(needed by .*\) \(.*params\.yaml:11\)"),
]


@pytest.mark.parametrize("name, setting, message", BAD_PARAMS, ids=[row[0] for row in BAD_PARAMS])
def test_bad_dpo_params_are_one_error_line_naming_the_key(recipe, name, setting, message):
    sets = [a for part in setting.split(" --set ") for a in ("--set", part)]
    result = _cs_run("train", "-p", recipe / "params.yaml", "--model_dir", recipe / f"bad_{name}", *sets)
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert re.fullmatch(r"Error: " + message + r".*", lines[0]), lines[0]
    assert not list((recipe / f"bad_{name}").glob("checkpoint_*"))


# ----------------------------------------------------------------------------------------------- the model


def _tiny_dpo(dpo: dict, dropout: float = 0.0):
    from cs_run.models.dpo.model import build_model  # noqa: PLC0415

    torch.manual_seed(0)
    policy = dict(POLICY, name="mistral", dropout_rate=dropout, attention_dropout_rate=dropout)
    return build_model(policy_model=policy, dpo=dpo)


@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge", "ipo", "dpop"])
def test_each_loss_type_of_the_model_is_its_formula_on_log_probs_by_hand(tmp_path, loss_type):
    """A policy moved off its reference: the model's loss is the vendor's formula on each answer's log-prob by
    hand (log-softmax at the labels under the mask, summed; averaged over the mask for ipo), in float32."""
    model = _tiny_dpo({"beta": 0.5, "loss_type": loss_type}).train()
    with torch.no_grad():
        for p in model.policy_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    write_dpo_shards(tmp_path / "train", pairs=4, seed=3)
    batch = _batch(tmp_path / "train")
    logps = {}
    for role, lm in (("policy", model.policy_model), ("ref", model.ref_model)):
        for side in ("chosen", "rejected"):
            mask = batch[f"{side}_attention_mask"].double()
            logits = lm.model(batch[f"{side}_input_ids"]).detach().double()
            picked = torch.log_softmax(logits, -1).gather(-1, batch[f"{side}_labels"].long().unsqueeze(-1)).squeeze(-1)
            total = (picked * mask).sum(-1)
            logps[role, side] = (total / mask.sum(-1) if loss_type == "ipo" else total).tolist()
    beta, expected = 0.5, []
    for pc, pr, rc, rr in zip(*(logps[k] for k in (("policy", "chosen"), ("policy", "rejected"), ("ref", "chosen"),
                                                   ("ref", "rejected")))):
        h = (pc - pr) - (rc - rr)
        expected.append({"sigmoid": math.log1p(math.exp(-beta * h)), "hinge": max(0.0, 1 - beta * h),
                         "ipo": (h - 1 / (2 * beta)) ** 2,
                         "dpop": math.log1p(math.exp(-beta * (h - 5.0 * max(0.0, rc - pc))))}[loss_type])
    got = float(model(batch).detach())
    assert abs(got - sum(expected) / 4) < 1e-5 * max(1.0, abs(got))


def test_the_reference_is_frozen_in_eval_mode_and_dropout_follows_disable_dropout():
    dropouts = lambda module: {m.p for m in module.modules() if isinstance(m, torch.nn.Dropout)}  # noqa: E731
    off = _tiny_dpo({}, dropout=0.3).train()
    assert dropouts(off.policy_model) == dropouts(off.ref_model) == {0.0}
    on = _tiny_dpo({"disable_dropout": False}, dropout=0.3).train()
    assert 0.3 in dropouts(on.policy_model) and on.policy_model.training
    assert not on.ref_model.training and not any(p.requires_grad for p in on.ref_model.parameters())
    free = _tiny_dpo({"reference_free": True})
    assert free.ref_model is None and not any(k.startswith("ref_model.") for k in free.state_dict())
