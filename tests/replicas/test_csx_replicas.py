"""Two CSX replicas through the real launcher: the gradient all-reduce traced into the step
(docs/architecture.md#replicas-on-csx) gives one process's weights.

``cs-run train --device CSX --num_csx 2`` (self-launched by torch's elastic agent, gloo, tier fx) with the
global batch 64 split 2 x 32, against one eager process with batch 64. Tolerance (atol 2e-6, rtol 1e-5,
as tests/replicas/test_replica_runs.py): the same mean gradient summed in another order (each replica's
half, then the average of the halves), so float32 rounding compounds over the 50 SGD-with-momentum
steps; observed ~2.4e-7 on weights of magnitude <= 0.4. Without the all-reduce each replica would train
on its own half and differ by orders of magnitude more.
"""

from __future__ import annotations

from tests.replicas.test_replica_runs import _assert_close, _cs_run, _invoke, _run

ARGS = ["--max_steps", 50, "--set", "model.dropout=0.0", "--set", "runconfig.log_steps=25",
        "--set", "runconfig.checkpoint_steps=50"]


def test_two_csx_replicas_half_batch_match_one_eager_process_whole_batch(tmp_path):
    two = tmp_path / "two"
    result = _run(_cs_run("train", "--device", "CSX", "--num_csx", 2, "--model_dir", two, *ARGS,
                          "--set", "runconfig.compile_tier=fx", "--collective_timeout", 60))
    assert result.returncode == 0, result.stderr
    assert "Replica 0 of 2 joined" in result.stderr and "traced " in result.stderr
    assert result.stderr.count("Saved checkpoint") == 1  # ordinal 0 alone writes
    one = tmp_path / "one"
    eager = _invoke("train", "--model_dir", one, *ARGS)
    assert eager.exit_code == 0, eager.output
    _assert_close(one / "checkpoint_50.mdl", two / "checkpoint_50.mdl")  # weights and optimizer state
