"""The vendor 2.10 names cs-run gained behave as the vendor's sources say (the signatures are in test_api_diff)."""

from __future__ import annotations

import warnings

import pytest
import torch

import cs_run as cstorch
from cs_run.backend import _reset_for_tests
from cs_run.errors import CsRunError


def test_backend_helpers_follow_the_current_backend():
    with _reset_for_tests():
        assert cstorch.backend() is None and not cstorch.use_cs()
        assert cstorch.current_torch_device() == torch.device("cpu")
        with pytest.raises(CsRunError, match="No active Cerebras backend"):
            cstorch.current_backend(raise_warning=False)
        assert cstorch.current_backend(raise_exception=False, raise_warning=False) is None
        with pytest.raises(TypeError, match="Expected backend_type"):
            cstorch.backend(artifact_dir="x")
        be = cstorch.backend("csx")
        assert cstorch.backend() is be and cstorch.use_cs() and be.backend_type.name == "CSX"
        assert be.backend_type == "CSX" and be.backend_type.is_csx and not be.backend_type.is_cpu
        assert cstorch.current_torch_device() == be.torch_device
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert cstorch.current_backend() is be
        assert any(issubclass(w.category, DeprecationWarning) for w in caught)


def test_creation_ops_take_the_vendor_keywords_and_the_torch_form():
    t = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(cstorch.zeros(shape=(2, 3), dtype=torch.float16), torch.zeros(2, 3, dtype=torch.float16))
    assert torch.equal(cstorch.zeros(2, 3), torch.zeros(2, 3))  # the porting guide's torch form
    assert torch.equal(cstorch.ones((4,), torch.int32), torch.ones(4, dtype=torch.int32))
    assert torch.equal(cstorch.full(shape=(2,), value=7, dtype=torch.int64), torch.full((2,), 7))
    assert torch.equal(cstorch.full_like(other=t, value=2.5), torch.full_like(t, 2.5))
    assert torch.equal(cstorch.zeros_like(other=t, dtype=torch.int8), torch.zeros_like(t, dtype=torch.int8))
    assert torch.equal(cstorch.ones_like(t), torch.ones_like(t))
    assert cstorch.to_numpy(cstorch.from_numpy(t.numpy())).tolist() == t.tolist()


def test_save_and_load_take_the_vendor_keywords(tmp_path):
    state = {"w": torch.arange(3.0), "global_step": 4}
    cstorch.save(state_dict=state, ckpt_path=tmp_path / "c.mdl")
    loaded = cstorch.load(ckpt_path=tmp_path / "c.mdl", map_location="cpu")
    assert torch.equal(loaded["w"], state["w"]) and loaded["global_step"] == 4


def test_half_dtype_state():
    from cs_run import amp

    try:
        assert amp.set_half_dtype("cbfloat16") == torch.bfloat16 and amp.mixed_precision()
        assert amp.get_floating_point_dtype() == torch.bfloat16
        amp.set_half_dtype(torch.float16)
        assert amp.get_half_dtype() == torch.float16 and amp.get_half_dtype_str() == "float16"
        amp.enable_mixed_precision(False)
        assert amp.get_floating_point_dtype() == torch.float32 and amp.get_floating_point_dtype_str() == "float32"
        with pytest.raises(CsRunError, match="Invalid half dtype"):
            amp.set_half_dtype(torch.float64)
    finally:
        amp.set_half_dtype("float16")
        amp.enable_mixed_precision(False)


def test_grad_scaler_defaults_are_the_vendors():
    from cs_run.amp import GradScaler

    scaler = GradScaler()
    assert not scaler.enabled  # loss_scale=None: no scaling
    assert GradScaler(loss_scale="dynamic").overflow_tolerance == 0.0


def test_distributed_single_process():
    from cs_run import distributed as dist

    assert dist.is_streamer() and dist.num_tasks() == 1 and dist.is_master_ordinal(local=True)
    assert dist.get_streaming_batch_size(8, global_rank=0) == 8


def test_data_helpers():
    from cs_run.utils import data

    class HalfRestartable(torch.utils.data.DataLoader):
        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            pass

    class Restartable(HalfRestartable):
        def aggregate_state_dict(self, worker_states):
            return {}

        def deaggregate_state_dict(self, aggregated_state_dict):
            return {}

    ds = torch.utils.data.TensorDataset(torch.arange(10.0))
    plain = data.DataLoader(lambda: torch.utils.data.DataLoader(ds, batch_size=5))
    restartable = data.DataLoader(lambda: Restartable(ds, batch_size=2))
    assert not plain.is_restartable and restartable.is_restartable and plain.batch_size == 5
    # the vendor's protocol needs all four methods (its isinstance says False for the first two alone)
    assert not data.DataLoader(lambda: HalfRestartable(ds, batch_size=2)).is_restartable
    schedule = data.Schedule([data.Schedule.Range(0, 10, 4, include_last=True)])
    assert [i for i in range(12) if i in schedule] == [0, 4, 8, 9]
    sampler = data.DistributedSampler(ds, shuffle=True, seed=3, start_index=2, batch_size=3)
    expected = torch.randperm(10, generator=torch.Generator().manual_seed(3)).tolist()[2:8]
    assert len(sampler) == 2 and list(sampler) == [expected[:3], expected[3:]]
    assert len(sampler) == 4  # the next pass: the 2 samples left over, then epoch 1 (the vendor's order)
    ex = data.DataExecutor(plain, num_steps=2, profiler_activities=[object])
    assert len(list(ex)) == 2 and ex.profiler.global_rate() > 0 and isinstance(ex.profiler.rate(), float)


def test_tensorboard_writer_and_reader_round_trip(tmp_path):
    from cs_run.utils.tensorboard import SummaryReader, SummaryWriter

    with SummaryWriter(log_dir=str(tmp_path), base_step=5) as writer:
        writer.add_scalar("loss", torch.tensor(0.5))
        writer.add_scalar("loss", 0.25, global_step=6)
        writer.add_scalar("other", 1.0, 6)
    reader = SummaryReader(str(tmp_path), filter="^loss$")
    assert reader.scalar_names() == {"loss"}
    assert [(e.step, e.value) for e in reader.read_scalar("loss")] == [(5, 0.5), (6, 0.25)]
    assert reader.read_scalar("loss", step=6).value == 0.25
    with pytest.raises(KeyError):
        reader.read_scalar("loss", step=9)


def test_release_2_0_csconfig_and_executor_keyword():
    from cs_run.utils import CSConfig, data

    config = CSConfig(num_csx=None, max_wgt_servers=2, mgmt_namespace="ns", debug_args=None, job_labels=["a=b"])
    config.precision_opt_level = 1
    assert (config.num_csx, config.max_wgt_servers, config.job_labels, config.mgmt_namespace) == (1, 2, ["a=b"], "ns")
    with pytest.raises(TypeError):
        CSConfig(num_wgt_servers=2)  # the runconfig spelling is not a field
    ds = torch.utils.data.TensorDataset(torch.arange(4.0))
    executor = data.DataExecutor(data.DataLoader(lambda: torch.utils.data.DataLoader(ds, batch_size=2)),
                                 num_steps=1, cs_config=config)
    assert executor.cs_config is config and len(list(executor)) == 1
