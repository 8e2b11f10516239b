"""The Strategy's rules that need no process group: which modules become FSDP groups, the tree walk the
checkpoint gather uses, and the table of refused sharding / offload combinations."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from cs_run import parallel
from cs_run.engine import CompiledStep, EngineOptions
from cs_run.errors import ParamsError
from cs_run.parallel import FullyShardedStrategy, Layout, Offload, Sharding, Strategy, build_strategy, resolve_layout
from cs_run.parallel.fsdp import shard_units
from cs_run.parallel.strategy import map_tensors
from cs_run.registry import get_model_spec, resolve_object

TINY = dict(vocab_size=32, hidden_size=16, num_hidden_layers=3, num_heads=2, filter_size=24, max_position_embeddings=16)


def test_the_groups_are_the_decoder_blocks_not_the_module_lists_inside_them():
    model = resolve_object(get_model_spec("gpt2").model_fn)(**TINY)
    blocks = list(model.model.transformer_decoder.layers)
    # gpt2's feed-forward holds a ModuleList of its own inside each block: it stays in its block's group.
    assert any(isinstance(m, torch.nn.ModuleList) for m in blocks[0].modules())
    assert [id(u) for u in shard_units(model)] == [id(b) for b in blocks]


def test_a_model_without_blocks_is_one_group_and_blocks_without_parameters_are_none():
    assert shard_units(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())) == []
    lists = torch.nn.Module()
    lists.acts = torch.nn.ModuleList([torch.nn.ReLU(), torch.nn.ReLU()])
    lists.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])
    assert shard_units(lists) == list(lists.blocks)


def test_map_tensors_keeps_the_tree_its_order_and_other_leaves():
    tree = {"model": OrderedDict(b=torch.ones(2), a=torch.zeros(1)), "step": 3, "groups": [{"lr": 0.1}],
            "pair": (torch.ones(1), "x")}
    seen = []
    out = map_tensors(tree, lambda t: seen.append(t.numel()) or t + 1)
    assert seen == [2, 1, 1]  # insertion order: the same on every replica, so collectives line up
    assert isinstance(out["model"], OrderedDict) and list(out["model"]) == ["b", "a"]
    assert torch.equal(out["model"]["b"], torch.full((2,), 2.0)) and out["step"] == 3
    assert out["groups"] == [{"lr": 0.1}] and out["pair"][1] == "x" and isinstance(out["pair"], tuple)


def test_data_parallel_state_is_read_and_written_in_place():
    target = {"model": {"w": torch.ones(2)}}
    strategy = Strategy()
    assert strategy.gather(target) is target and strategy.load_target(target) is target
    assert strategy.place_loaded(target, target) is target and strategy.agree_stop(15, True) == (15, True)


def test_the_strategy_of_each_setting():
    assert type(build_strategy()) is Strategy
    fsdp = build_strategy(Layout(Sharding.FSDP))
    assert type(fsdp) is FullyShardedStrategy and fsdp.offload == "none"
    alone = build_strategy(Layout(Sharding.NONE, Offload.CPU))  # offload alone: FSDP2 over the one replica
    assert isinstance(alone, FullyShardedStrategy) and alone.offload == "cpu"


@pytest.mark.parametrize("sharding, offload, n, device, message", [
    ("zero3", "none", 1, "CPU", "runconfig.sharding: 'zero3' is not one of none, fsdp"),
    ("none", "nvme", 1, "CPU", "runconfig.offload: 'nvme' is not one of none, cpu"),
    ("fsdp", "none", 2, "CSX", "runconfig.sharding: fsdp with --device CSX"),
    ("none", "cpu", 1, "csx", "runconfig.offload: cpu with --device CSX"),
    ("none", "cpu", 2, "GPU", "runconfig.offload: cpu with 2 data-parallel replicas (sharding: none)"),
])
def test_combinations_that_do_not_work(sharding, offload, n, device, message):
    with pytest.raises(ParamsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_layout(sharding, offload, n, device)


@pytest.mark.parametrize("sharding, offload, n, device", [
    ("none", "none", 4, "CSX"), ("fsdp", "none", 4, "CPU"), ("fsdp", "cpu", 2, "GPU"), ("none", "cpu", 1, "CPU")])
def test_combinations_that_work(sharding, offload, n, device):
    assert resolve_layout(sharding, offload, n, device) == Layout(Sharding(sharding), Offload(offload))


def test_the_csx_engine_asks_the_strategy_who_all_reduces():
    """One process: no in-graph all-reduce. A sharded strategy refuses the engine (whole-model steps only),
    so a traced step can never all-reduce sharded gradients as if they were whole."""
    assert parallel.Strategy().traced_group() is None
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    previous = parallel.current()
    try:
        parallel.use(parallel.FullyShardedStrategy(offload="cpu"))
        with pytest.raises(ParamsError, match="runconfig.sharding: the CSX engine traces whole-model steps, not "
                                              "sharding=fsdp / offload=cpu"):
            CompiledStep(step, EngineOptions(compile_tier="fx"))(torch.ones(4, 3))
    finally:
        parallel.use(previous)
