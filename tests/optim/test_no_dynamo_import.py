"""Building, zeroing, saving and loading a cs_run optimizer does not import torch._dynamo.

torch wraps those Optimizer methods in ``torch._disable_dynamo``, whose first call imports dynamo (and
inductor): 1.5 s or more at the start of every CPU or GPU run. cs_run calls the plain methods while
dynamo is not loaded (``cs_run._torch_compat.without_dynamo_wrapper``) and torch's wrapped ones once it is.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
import torch
from cs_run.optim import SGD, AdamW
model = torch.nn.Linear(3, 2)
out = {}
for cls in (SGD, AdamW):
    opt = cls(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    opt.zero_grad()
    saved = opt.state_dict()
    opt.load_state_dict(saved)
    opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    out[cls.__name__] = {"grads_cleared": all(p.grad is None for p in model.parameters()),
                         "groups": len(opt.param_groups), "saved_keys": sorted(saved)}
out["dynamo_loaded"] = "torch._dynamo" in sys.modules
import torch._dynamo  # from here on torch's own wrapped methods are used
opt = SGD(model.parameters(), lr=0.1)
model(torch.randn(4, 3)).sum().backward()
opt.zero_grad()
out["after_dynamo"] = {"grads_cleared": all(p.grad is None for p in model.parameters()),
                       "saved_keys": sorted(opt.state_dict())}
print(json.dumps(out))
"""


def test_optimizer_methods_do_not_import_dynamo_and_still_do_their_job():
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["dynamo_loaded"] is False
    for name in ("SGD", "AdamW"):
        assert out[name] == {"grads_cleared": True, "groups": 2, "saved_keys": ["param_groups", "state"]}
    assert out["after_dynamo"] == {"grads_cleared": True, "saved_keys": ["param_groups", "state"]}
