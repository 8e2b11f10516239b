"""The Model Zoo trainer's ``schedulers`` list (issue 39): every entry its own scheduler, side by side.

The reference is Model Zoo 2.10 dino's ``params_dinov2_large_224_bs2048.yaml`` (read from the local mirror
of github:Cerebras/modelzoo, never copied here; skipped without it): one CosineDecayWD of the ``wd_params``
groups and 28 SequentialLRs, each of the groups its ``param_group_tags`` names and handing those tags to
the schedules inside it (the vendor's ``trainer/validate.py``). The model (dino) is not built: a stand-in
whose parameter names the file's ``params`` globs sort into every tag. Each group's lr and weight decay at
a set of steps is compared with a hand computation from the vendor's formulas (LinearLR, CosineDecayLR and
CosineDecayWD of ``cerebras.pytorch.optim``, the milestones the running sum of the phases' total_iters).
"""

from __future__ import annotations

import math
import re
import subprocess

import pytest
import torch
import yaml

import cs_run.optim as csoptim
from cs_run.errors import ParamsError
from cs_run.params import load_params
from cs_run.resolve import check_optimizer_section, resolve_params
from cs_run.runners import build_lr_scheduler, build_optimizer

MIRROR = "/work/.mirror/Cerebras+modelzoo/repo"
DINO = "src/cerebras/modelzoo/models/vision/dino/configs/params_dinov2_large_224_bs2048.yaml"
STEPS = (0, 1, 7, 1249, 1250, 1251, 6000, 12499, 12500, 12501, 70000, 124999, 125000, 130000)
"""Both ends and both sides of each phase boundary (1250 and 12500), inside the cosine, and past the end."""


def _dino_text() -> str:
    try:
        return subprocess.run(["git", f"--git-dir={MIRROR}", "show", f"Release_2.10.0:{DINO}"],
                              capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no local Model Zoo mirror (github:Cerebras/modelzoo)")


# -- the vendor's formulas, by hand -------------------------------------------------------------------
def _linear(initial: float, end: float, total: int, t: int) -> float:
    return initial + (end - initial) * min(t, total) / total


def _cosine(initial: float, end: float, total: int, t: int) -> float:
    return end + (initial - end) * 0.5 * (1 + math.cos(math.pi * min(t, total) / total))


_FORMULAS = {"LinearLR": _linear, "CosineDecayLR": _cosine, "CosineDecayWD": _cosine}


def _by_hand(name: str, args: dict, t: int) -> float:
    """One schedule entry of the file at step ``t``; a SequentialLR runs phase k from the running sum of
    the earlier phases' total_iters, at the step shifted by it."""
    if name == "SequentialLR":
        start = 0
        phases = [next(iter(p.items())) for p in args["schedulers"]]
        for index, (phase, phase_args) in enumerate(phases):
            if index == len(phases) - 1 or t < start + phase_args["total_iters"]:
                return _by_hand(phase, phase_args, t - start)
            start += phase_args["total_iters"]
    keys = ("initial_learning_rate", "end_learning_rate") if name.endswith("LR") else ("initial_val", "end_val")
    return _FORMULAS[name](args[keys[0]], args[keys[1]], args["total_iters"], t)


# -- a stand-in with the parameters the tags name -------------------------------------------------------
LAYERS = 24


def _names() -> list[str]:
    trunk = "trunk.image_model"
    names = [f"{trunk}.embedding_layer.mask_token", f"{trunk}.embedding_layer.cls_embedding",
             f"{trunk}.embedding_layer.position_embeddings.weight", f"{trunk}.embedding_layer.linear_proj.weight",
             f"{trunk}.embedding_layer.linear_proj.bias", f"{trunk}.encoder.transformer_encoder.norm.weight",
             f"{trunk}.encoder.transformer_encoder.norm.bias", "head.mlp.0.weight", "head.mlp.0.bias",
             "head.last_layer.weight"]
    for i in range(LAYERS):
        layer = f"{trunk}.encoder.transformer_encoder.layers.{i}"
        names += [f"{layer}.self_attn.proj_q.weight", f"{layer}.self_attn.proj_q.bias", f"{layer}.ffn.fc.weight",
                  f"{layer}.norm1.weight"]
    return names


def _stand_in() -> torch.nn.Module:
    root = torch.nn.Module()
    for name in _names():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, torch.nn.Parameter(torch.zeros(2)))
    return root


def _expected_tags(name: str) -> tuple[str, bool]:
    """The lr tag and whether the weight decay is scheduled, for a stand-in name, read off the file's globs
    by hand (not by the code under test)."""
    if "transformer_encoder.layers." in name:
        lr_tag = f"lr_layer_{name.split('layers.')[1].split('.')[0]}_params"
    elif "mask_token" in name or "cls_embedding" in name or "position_embeddings" in name:
        lr_tag = "lr_emb_params"
    elif "linear_proj" in name:
        lr_tag = "lr_proj_params"
    elif "last_layer" in name:
        lr_tag = "lr_last_layer_params"
    else:
        lr_tag = "default_lr_params"  # head.mlp.*, transformer_encoder.norm.*
    decayed = ("mask_token" in name or "cls_embedding" in name or name == "head.last_layer.weight"
               or (name.endswith(".weight") and (".mlp." in name or ".embedding_layer." in name
                                                 or ".self_attn." in name or ".ffn." in name)))
    return lr_tag, decayed


@pytest.fixture(scope="module")
def dino(tmp_path_factory):
    text = _dino_text()
    path = tmp_path_factory.mktemp("dino") / "params_dinov2_large_224_bs2048.yaml"
    path.write_text(text)
    entries = yaml.safe_load(text)["trainer"]["init"]["schedulers"]
    by_tag = {next(iter(e.values()))["param_group_tags"]: next(iter(e.items())) for e in entries}
    return path, by_tag


def _built(path):
    params = load_params(path)
    model = _stand_in()
    optimizer = build_optimizer(params.optimizer, model)
    return model, optimizer, build_lr_scheduler(params.optimizer, optimizer)


def test_dino_bs2048_file_builds_29_schedulers_side_by_side(dino):
    path, by_tag = dino
    params = load_params(path)
    assert params.optimizer.schedulers is not None and len(params.optimizer.schedulers) == 29
    check_optimizer_section(params.optimizer)  # the trainer section is accepted before any model is built
    _, optimizer, schedulers = _built(path)
    assert isinstance(schedulers, csoptim.ParallelSchedulers) and len(schedulers) == 29
    assert type(schedulers[0]).__name__ == "CosineDecayWD" and schedulers[0].param_group_key == "weight_decay"
    for scheduler in schedulers[1:]:  # each SequentialLR handed its tags to its phases (the vendor's validate.py)
        assert type(scheduler).__name__ == "SequentialLR" and len(scheduler.param_group_tags) == 1
        assert all(child.param_group_tags == scheduler.param_group_tags for child in scheduler._schedulers)
    assert {tag for s in schedulers for tag in s.param_group_tags} == set(by_tag)


def test_dino_bs2048_lr_and_weight_decay_of_every_parameter_by_hand(dino):
    path, by_tag = dino
    model, optimizer, schedulers = _built(path)
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    checked = 0
    for t in STEPS:
        schedulers.load_state_dict({"last_epoch": t})  # a checkpoint of one schedule: every one at step t
        for name, param in model.named_parameters():
            group = group_of[id(param)]
            lr_tag, decayed = _expected_tags(name)
            assert lr_tag in group["tags"], (name, group["tags"])
            lr = _by_hand(*by_tag[lr_tag], t)
            assert float(group["lr"]) == pytest.approx(lr, rel=1e-6, abs=1e-12), (name, t)
            wd = _by_hand(*by_tag["wd_params"], t) if decayed else 0.0
            assert float(group["weight_decay"]) == pytest.approx(wd, rel=1e-6), (name, t)
            checked += 1
    assert checked == len(STEPS) * len(_names())
    # the last layer's frozen first phase, by hand: 0 for 1250 steps, then 10x below its peak, rising
    last = next(g for g in optimizer.param_groups if "lr_last_layer_params" in g["tags"])
    schedulers.load_state_dict({"last_epoch": 1250})
    assert float(last["lr"]) == pytest.approx(0.0005656854249492381, rel=1e-6)


def test_stepping_equals_jumping_and_the_state_round_trips(dino):
    path, _ = dino
    _, optimizer, schedulers = _built(path)
    for _ in range(5):
        schedulers.step()
    stepped = [(float(g["lr"]), float(g["weight_decay"])) for g in optimizer.param_groups]
    state = schedulers.state_dict()
    assert [int(s["last_epoch"]) for s in state["schedulers"]] == [5] * 29  # the vendor trainer's list of states
    _, other_optimizer, other = _built(path)
    other.load_state_dict(state)
    assert [(float(g["lr"]), float(g["weight_decay"])) for g in other_optimizer.param_groups] == stepped
    other.load_state_dict({"last_epoch": torch.tensor(5)})
    assert [(float(g["lr"]), float(g["weight_decay"])) for g in other_optimizer.param_groups] == stepped
    with pytest.raises(ValueError, match="the checkpoint holds 2 scheduler states and this run has 29"):
        other.load_state_dict({"schedulers": state["schedulers"][:2]})


def test_dino_bs2048_resolves_with_its_model_and_29_side_by_side_schedulers(dino):
    """The whole file (the dino family now built) passes the params check, its schedulers kept side by side."""
    path, by_tag = dino
    params = load_params(path)
    resolve_params(params)
    assert params.model.name == "dino"
    assert len(params.optimizer.schedulers) == len(by_tag) == 29


# -- bad inputs -----------------------------------------------------------------------------------------
BASE = """\
trainer:
  init:
    model:
      name: fc_mnist
    optimizer:
      AdamW:
        params:
        - params: ['*.0.weight']
          tag: first
        - params: ['*.2.*']
          tag: second
    schedulers:
    - CosineDecayWD:
        initial_val: 0.04
        end_val: 0.4
        total_iters: 10
        param_group_tags: first
    - SequentialLR:
        schedulers:
        - LinearLR:
            initial_learning_rate: 0.0
            end_learning_rate: 0.1
            total_iters: 2
        - CosineDecayLR:
            initial_learning_rate: 0.1
            end_learning_rate: 0.0
            total_iters: 8
        param_group_tags: second
    loop:
      max_steps: 10
"""

BAD = [
    # (what to replace, with what, the error); the error's line is the line marked "# <- here", else the list's
    ("    loop:\n", "    - ConstantLR:\n        learning_rate: 0.1\n    loop:\n",
     r"params: optimizer.schedulers: optimizer.schedulers\[1\].SequentialLR \(SequentialLR\) and "
     r"optimizer.schedulers\[2\].ConstantLR \(ConstantLR\) both set 'lr' and at least one names no param_group_tags"),
    ("        param_group_tags: second\n", "        param_group_tags: first\n    - ConstantLR:\n"
                                           "        learning_rate: 0.1\n        param_group_tags: [second, first]\n",
     r"params: optimizer.schedulers: optimizer.schedulers\[1\].SequentialLR \(SequentialLR\) and "
     r"optimizer.schedulers\[2\].ConstantLR \(ConstantLR\) both set 'lr' of the groups tagged \['first'\]"),
    ("            total_iters: 2\n", "            total_iters: 2\n            param_group_tags: first  # <- here\n",
     r"params: optimizer.schedulers\[1\].SequentialLR.schedulers\[0\].LinearLR.param_group_tags: a schedule inside "
     r"SequentialLR takes its param_group_tags from the SequentialLR"),
    ("    - CosineDecayWD:\n", "    - CosineDecayW:  # <- here\n",
     r"params: optimizer.schedulers\[0\].CosineDecayW: unknown 'CosineDecayW'; expected one of .*CosineDecayLR, "
     r"CosineDecayWD.* \(did you mean 'CosineDecayWD'\?\)"),
    ("    - CosineDecayWD:\n        initial_val: 0.04\n        end_val: 0.4\n        total_iters: 10\n"
     "        param_group_tags: first\n",
     "    - CosineDecayWD:  # <- here (the entry whose tag is misspelt)\n        initial_val: 0.04\n        end_val: 0.4\n"
     "        total_iters: 10\n        param_group_tags: frist\n",
     r"params: optimizer.schedulers\[0\].CosineDecayWD: param_group_tags \['frist'\] match no param group of the "
     r"optimizer \(its groups' tags: \['first', 'second'\]\)"),
    ("        - LinearLR:\n", "        - LinearWD:  # <- here\n",
     r"params: optimizer.schedulers\[1\].SequentialLR.schedulers\[0\].LinearWD: unknown 'LinearWD'; expected one "
     r"of ChainedLR"),
]


@pytest.mark.parametrize("old,new,regex", BAD, ids=[f"case{i}" for i in range(len(BAD))])
def test_bad_schedulers_are_one_error_naming_the_key_and_line(tmp_path, old, new, regex):
    assert old in BASE
    text = BASE.replace(old, new, 1)
    path = tmp_path / "params.yaml"
    path.write_text(text)
    rows = text.splitlines()
    line = next((i for i, row in enumerate(rows, 1) if "# <- here" in row), rows.index("    schedulers:") + 1)
    with pytest.raises(ParamsError) as caught:
        resolve_params(load_params(path))
    message = str(caught.value)
    assert re.match(regex, message), message
    assert message.endswith(f"({path}:{line})"), message


def test_the_optimizer_lr_beside_schedulers_is_the_lr_of_the_groups_no_schedule_sets(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(BASE.replace("      AdamW:\n", "      AdamW:\n        learning_rate: 0.3\n"))
    params = load_params(path)
    check_optimizer_section(params.optimizer)
    assert params.optimizer.extra["lr"] == 0.3 and params.optimizer.learning_rate is None


def test_the_resolved_params_of_a_run_load_again(tmp_path):
    """params_resolved.yaml (flat: optimizer.schedulers) reads back as the same schedules."""
    from cs_run.params import save_params  # noqa: PLC0415

    path = tmp_path / "params.yaml"
    path.write_text(BASE)
    params = load_params(path)
    again = load_params(save_params(params, tmp_path / "md"))
    assert again.optimizer.schedulers == params.optimizer.schedulers and again.optimizer.learning_rate is None
    check_optimizer_section(again.optimizer)


def test_flat_learning_rate_and_schedulers_together_are_refused(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("model:\n  name: fc_mnist\noptimizer:\n  optimizer_type: SGD\n  learning_rate: 0.1\n"
                    "  schedulers:\n  - ConstantLR:\n      learning_rate: 0.1\n      param_group_tags: a\n")
    with pytest.raises(ParamsError, match=r"^params: optimizer.learning_rate and optimizer.schedulers are two "
                                          rf"schedules of the lr; keep one .*\({re.escape(str(path))}:6\)$"):
        load_params(path)


def test_a_group_set_by_two_schedulers_of_one_key_is_refused():
    """Tags {a, b} on one group, one LR schedule of a and one of b: the vendor's per-group rule."""
    weights = [torch.nn.Parameter(torch.zeros(1)) for _ in range(3)]
    optimizer = csoptim.SGD([{"params": [weights[0]], "tags": {"a", "b"}}, {"params": [weights[1]], "tags": {"a"}},
                             {"params": [weights[2]], "tags": {"b"}}], lr=0.1)
    entries = [{"ConstantLR": {"learning_rate": 0.1, "param_group_tags": "a"}},
               {"ConstantLR": {"learning_rate": 0.2, "param_group_tags": "b"}}]
    with pytest.raises(ParamsError, match=r"^schedulers: schedulers\[0\].ConstantLR \(ConstantLR\) and "
                                          r"schedulers\[1\].ConstantLR \(ConstantLR\) all set 'lr' of param group 0"):
        csoptim.configure_schedulers(optimizer, entries)
    optimizer.param_groups[0]["tags"] = {"a"}  # one tag per group: accepted, each group its own schedule
    schedulers = csoptim.configure_schedulers(optimizer, entries)
    assert [float(g["lr"]) for g in optimizer.param_groups] == pytest.approx([0.1, 0.1, 0.2])
    assert len(schedulers) == 2


# -- a run: the runner steps them all, checkpoints their list and resumes it ----------------------------
RUN = """\
trainer:
  init:
    seed: 1
    model: {name: fc_mnist, depth: 1, hidden_size: 8, activation_fn: relu}
    optimizer:
      AdamW:
        params:
        - params: ['*.fc_layers.*']
          tag: hidden
        - params: ['*.last_layer.*']
          tag: out
        - params: ['*.weight']
          tag: wd
    schedulers:
    - CosineDecayWD: {initial_val: 0.04, end_val: 0.4, total_iters: 6, param_group_tags: wd}
    - SequentialLR:
        schedulers:
        - LinearLR: {initial_learning_rate: 0.0, end_learning_rate: 0.01, total_iters: 2}
        - CosineDecayLR: {initial_learning_rate: 0.01, end_learning_rate: 0.001, total_iters: 4}
        param_group_tags: hidden
    - SequentialLR:
        schedulers:
        - LinearLR: {initial_learning_rate: 0.0, end_learning_rate: 0.02, total_iters: 1}
        - CosineDecayLR: {initial_learning_rate: 0.02, end_learning_rate: 0.002, total_iters: 5}
        param_group_tags: out
    loop: {max_steps: 3}
    checkpoint: {steps: 1}
    logging: {log_steps: 1}
  fit:
    train_dataloader: {batch_size: 16, shuffle: false}
"""


def _train(tmp_path, name: str, *flags, steps: int = 3) -> dict:
    from click.testing import CliRunner  # noqa: PLC0415 - only the run tests use the CLI

    from cs_run.checkpoint import load  # noqa: PLC0415
    from cs_run.frontends.cli import cli  # noqa: PLC0415
    from cs_run.summaries import read_scalars  # noqa: PLC0415

    path = tmp_path / "params.yaml"
    path.write_text(RUN)
    model_dir = tmp_path / name
    result = CliRunner().invoke(cli, ["train", "--params", str(path), "--model_dir", str(model_dir), *map(str, flags)])
    assert result.exit_code == 0, result.output
    losses = [value for _, value in read_scalars(model_dir / "train")["loss"]]
    return {"losses": losses, "state": load(model_dir / f"checkpoint_{steps}.mdl")}


def _groups(state: dict) -> list[tuple[tuple[str, ...], float, float]]:
    return [(tuple(g["tags"]), float(g["lr"]), float(g["weight_decay"])) for g in state["optimizer"]["param_groups"]]


def test_a_run_steps_every_schedule_on_cpu_and_csx(tmp_path):
    """3 steps: the checkpoint holds the three states and every group's lr and weight decay at step 3, by
    hand: hidden 0.001 + 0.009 (1 + cos(pi/4)) / 2, out 0.002 + 0.018 (1 + cos(2 pi/5)) / 2, decayed weights
    0.4 - 0.36 (1 + cos(pi/2)) / 2 = 0.22; CSX (traced once) trains the same losses."""
    cpu, csx = _train(tmp_path, "cpu"), _train(tmp_path, "csx", "--device", "CSX")
    assert csx["losses"] == cpu["losses"] and len(cpu["losses"]) == 3
    hidden = 0.001 + 0.009 * (1 + math.cos(math.pi / 4)) / 2
    out = 0.002 + 0.018 * (1 + math.cos(2 * math.pi / 5)) / 2
    expected = [(("hidden", "wd"), hidden, 0.22), (("hidden",), hidden, 0.0), (("out", "wd"), out, 0.22),
                (("out",), out, 0.0)]  # the empty halves dropped, as the Model Zoo drops them when tags are used
    for run in (cpu, csx):
        assert [int(s["last_epoch"]) for s in run["state"]["lr_scheduler"]["schedulers"]] == [3, 3, 3]
        assert [(tags, pytest.approx(lr, rel=1e-6), pytest.approx(wd, rel=1e-6)) for tags, lr, wd in expected] \
            == _groups(run["state"])


@pytest.mark.slow
def test_a_resumed_run_continues_every_schedule(tmp_path):
    """From checkpoint 3 to step 5 equals 5 steps at once: the same losses and the same groups' values."""
    whole = _train(tmp_path, "whole", "--max_steps", 5, steps=5)
    _train(tmp_path, "parts")
    resumed = _train(tmp_path, "parts", "--max_steps", 5, steps=5)
    assert resumed["losses"] == whole["losses"] and len(whole["losses"]) == 5
    assert _groups(resumed["state"]) == _groups(whole["state"])
    for run in (resumed, whole):
        assert [int(s["last_epoch"]) for s in run["state"]["lr_scheduler"]["schedulers"]] == [5, 5, 5]


def _two_layers() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 2, bias=False))
    model.lr_adjustment_groups = {"second": {"param_filter_patterns": ["1.weight"], "scale": 0.5}}
    return model


def test_a_model_zoo_optimizer_block_with_schedulers_builds_them_side_by_side():
    """configure_from_params (the Model Zoo 1.x model's own optimizer) reads the flat optimizer.schedulers;
    with muP groups each LR schedule is scaled per group, as the vendor wraps it in ScalePerParamLR: the
    second layer's lr is 0.5 x its schedule's (a 0.2 constant), the first's its own 0.1, its wd 0.3."""
    block = {"optimizer_type": "SGD", "params": [{"params": "0.*", "tag": "a"}, {"params": "1.*", "tag": "b"}],
             "adjust_learning_rate": {"second": 0.5},
             "schedulers": [{"ConstantLR": {"learning_rate": 0.1, "param_group_tags": "a"}},
                            {"ConstantLR": {"learning_rate": 0.2, "param_group_tags": "b"}},
                            {"ConstantWD": {"val": 0.3, "param_group_tags": "a"}}]}
    model = _two_layers()
    optimizer, schedulers, _ = csoptim.configure_from_params(block, model)
    assert isinstance(schedulers, csoptim.ParallelSchedulers)
    assert [type(s).__name__ for s in schedulers] == ["ScalePerParamLR", "ScalePerParamLR", "ConstantWD"]
    schedulers.step()
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    first, second = (group_of[id(layer.weight)] for layer in model)
    assert (float(first["lr"]), float(first["weight_decay"])) == pytest.approx((0.1, 0.3))
    assert (float(second["lr"]), float(second["weight_decay"])) == pytest.approx((0.1, 0.0))  # 0.5 x 0.2
