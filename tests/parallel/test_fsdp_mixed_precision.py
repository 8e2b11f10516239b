"""A params file that asks for bfloat16 (``model.mixed_precision`` + ``use_bfloat16``) on 2 sharded
replicas: FSDP2's MixedPrecisionPolicy gathers each block's parameters in bfloat16 and reduce-scatters
the gradients in float32, while the sharded parameters, the optimizer state and the checkpoint stay
float32; the run's losses follow one unsharded process under bfloat16 autocast.

Tolerance: bfloat16 keeps 8 significant bits (~4e-3 relative per rounding). The two runs round at other
places (FSDP2 casts every parameter, the embedding and norms included, before autocast sees them; the
replicas' gradients are reduced from bfloat16 halves of the batch), so their losses (4.14 down to 3.35)
agree to bfloat16 precision, not float32's: atol 0.01, below one bfloat16 step at these values (0.016);
observed: 1e-3 over the 30 steps."""

from __future__ import annotations

import torch
import yaml
from fsdp_helpers import launch, losses, tensors, train_here, write_params


def test_bfloat16_params_shard_with_fsdp2_mixed_precision_and_train_like_one_bfloat16_process(tmp_path):
    params = write_params(tmp_path / "params.yaml")
    data = yaml.safe_load(params.read_text())
    data["model"].update(mixed_precision=True, use_bfloat16=True)
    params.write_text(yaml.safe_dump(data))
    train_here(params, tmp_path / "one")
    result = launch(params, tmp_path / "two", "--num_csx", 2, "--sharding", "fsdp")
    assert "; mixed precision: bfloat16 parameters, float32 gradient reductions" in result.stderr
    one, two = torch.tensor(losses(tmp_path / "one")), torch.tensor(losses(tmp_path / "two"))
    torch.testing.assert_close(two, one, atol=0.01, rtol=0)
    assert one[-1] < one[0] - 0.3  # both trained
    assert all(t.dtype == torch.float32 for t in tensors(tmp_path / "two" / "checkpoint_30.mdl").values()
               if t.is_floating_point())
