"""The up-front memory check counts what a sharded replica holds: with sharding: fsdp each of N replicas
keeps 1/N of the weights, gradients and Adam state (after building the whole weights once), so replicas
that could never each hold the whole model pass where data-parallel ones are refused."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cs_run.frontends.cli import cli
from cs_run.runners import _memory
from tests.cli.test_bad_sizes import MODULE, SIZED_PARAMS, _hand_count


@pytest.mark.parametrize("sharding, passes", [("none", False), ("fsdp", True)])
def test_four_sharded_replicas_fit_where_four_whole_ones_do_not(sharding, passes, tmp_path, monkeypatch):
    (tmp_path / "sized_models.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    params = tmp_path / "params.yaml"
    params.write_text(SIZED_PARAMS.format(optimizer="Adam", momentum=""))
    whole = _hand_count(1000, states=2, scalars=2)  # weights, gradients, Adam's two states and scalars
    monkeypatch.setattr(_memory, "_resident_bytes", lambda: 1 << 20)
    # Room for 4 processes with half a model each: a quarter of everything (~ the whole weights) fits.
    monkeypatch.setattr(_memory, "available_memory", lambda device: (4 * ((1 << 20) + whole // 2), "a stated amount"))
    result = CliRunner().invoke(cli, ["train", "--params", str(params), "--model_dir", str(tmp_path / "md"),
                                      "--num_csx", "4", "--sharding", sharding])
    assert result.exit_code == 2
    line = result.output.strip().splitlines()[-1]
    if passes:  # past the memory check: inside pytest the launch itself is what refuses
        assert "not possible from" in line and "replicas need" not in result.output, line
    else:
        assert line.startswith("Error: params: runconfig.num_csx: 4 replicas need"), line
