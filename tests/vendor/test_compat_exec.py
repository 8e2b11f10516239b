"""Unmodified vendor scripts through ``cs-run exec``: Model Zoo fc_mnist run.py of R_1.7 (PyTorchBaseModel),
Release_1.8 (``run(...)``), 1.9.1 (``get_params_from_args`` + ``main``) and 2.0.2 (``cerebras_pytorch``), and a
seed-001 style script with ``import cerebras.pytorch as cstorch``, on CPU and CSX.

The scripts below are written here in the shape of the vendor's files (their imports, the calls they make,
the dtypes their data gives: half images with to_float16 and int32 labels on CSX), with a synthetic
dataset in place of torchvision (CI has no vendor files and no network)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cs_run.frontends import compat

RUN_18 = '''
import os
import sys

sys.path.append(os.path.join(os.path.dirname(__file__), "../../.."))
from modelzoo.common.pytorch.run_utils import run
from modelzoo.fc_mnist.pytorch.data import get_eval_dataloader, get_train_dataloader
from modelzoo.fc_mnist.pytorch.model import MNISTModel
from modelzoo.fc_mnist.pytorch.utils import set_defaults


def main():
    run(MNISTModel, get_train_dataloader, get_eval_dataloader, set_defaults)


if __name__ == '__main__':
    main()
'''

RUN_19 = '''
import os
import sys

sys.path.append(os.path.join(os.path.dirname(__file__), "../../.."))
from modelzoo.common.run_utils.cli_pytorch import get_params_from_args


def main():
    params = get_params_from_args()
    from modelzoo.fc_mnist.pytorch.utils import set_defaults

    set_defaults(params)
    from modelzoo.common.pytorch.run_utils import main
    from modelzoo.fc_mnist.pytorch.data import get_eval_dataloader, get_train_dataloader
    from modelzoo.fc_mnist.pytorch.model import MNISTModel

    main(params, MNISTModel, get_train_dataloader, get_eval_dataloader)


if __name__ == '__main__':
    main()
'''

UTILS = '''
def set_defaults(params):
    params["train_input"]["shuffle"] = params["train_input"].get("shuffle", True)
    params["eval_input"]["shuffle"] = params["eval_input"].get("shuffle", False)
    params["model"]["to_float16"] = params["model"].get("to_float16", False)
    params["model"]["use_bfloat16"] = params["model"].get("use_bfloat16", False)
'''

# data.py: 1.8 (cb_model + get_input_dtype), 1.9.1 (+ get_streaming_batch_size), 2.0.2 (cerebras_pytorch)
DATA_HEAD = {
    "1.8": '''
import torch
from modelzoo.common.pytorch import cb_model as cm
from modelzoo.common.pytorch.utils import SampleGenerator, get_input_dtype

def _setup(input_params, params):
    use_cs = cm.use_cs() or cm.is_appliance()
    dtype = get_input_dtype(input_params.get("to_float16", True))
    return use_cs, input_params.get("batch_size"), dtype, cm.is_master_ordinal()
''',
    "1.9": '''
import torch
from modelzoo.common.pytorch import cb_model as cm
from modelzoo.common.pytorch.input_utils import get_streaming_batch_size
from modelzoo.common.pytorch.utils import SampleGenerator, get_input_dtype

def _setup(input_params, params):
    use_cs = cm.use_cs() or cm.is_appliance()
    dtype = get_input_dtype(input_params.get("to_float16", True))
    return use_cs, get_streaming_batch_size(input_params.get("batch_size")), dtype, cm.is_master_ordinal()
''',
    "2.0": '''
import torch
import cerebras_pytorch as cstorch
import cerebras_pytorch.distributed as dist
from modelzoo.common.pytorch.input_utils import get_streaming_batch_size
from modelzoo.common.pytorch.utils import SampleGenerator

def _setup(input_params, params):
    use_cs = cstorch.use_cs()
    use_bfloat16 = params["model"].get("use_bfloat16", False)
    dtype = torch.float32
    if input_params.get("to_float16", True) and (use_cs or torch.cuda.is_available()):
        dtype = torch.bfloat16 if use_bfloat16 else torch.float16
    assert dist.is_streamer() and dist.num_streamers() == 1
    return use_cs, get_streaming_batch_size(input_params.get("batch_size")), dtype, dist.is_master_ordinal()
''',
}
DATA_BODY = '''
class SyntheticMNIST(torch.utils.data.Dataset):
    """Stands in for torchvision's MNIST: normalized 1x28x28 images, integer labels."""

    def __init__(self, n, dtype, use_cs, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = ((torch.rand(n, 1, 28, 28, generator=g) - 0.1307) / 0.3081).to(dtype)
        self.y = torch.randint(0, 10, (n,), generator=g).to(torch.int32 if use_cs else torch.int64)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _loader(params, key, seed):
    input_params = params[key]
    assert params["runconfig"]["mode"] in ("train", "eval", "train_and_eval")
    use_cs, batch_size, dtype, download = _setup(input_params, params)
    if input_params.get("use_fake_data", False):
        return SampleGenerator(data=(torch.zeros(batch_size, 1, 28, 28, dtype=dtype),
                                     torch.zeros(batch_size, dtype=torch.int32 if use_cs else torch.int64)),
                               sample_count=10)
    return torch.utils.data.DataLoader(SyntheticMNIST(64, dtype, use_cs, seed), batch_size=batch_size,
                                       drop_last=input_params["drop_last_batch"], shuffle=input_params["shuffle"],
                                       num_workers=input_params.get("num_workers", 0))


def get_train_dataloader(params):
    return _loader(params, "train_input", 0)


def get_eval_dataloader(params):
    return _loader(params, "eval_input", 1)
'''

MODEL_HEAD = {
    "1.8": "from modelzoo.common.pytorch.metrics import AccuracyMetric\n"
           "from modelzoo.common.pytorch.run_utils import half_dtype_instance\n",
    "1.9": "from cerebras_pytorch.experimental.metrics import AccuracyMetric\n"
           "from modelzoo.common.pytorch.run_utils import half_dtype_instance\n",
    "2.0": "from cerebras_pytorch.metrics import AccuracyMetric\n"
           "from modelzoo.common.pytorch.run_utils import half_dtype_instance\n",
}
MODEL_BODY = '''
from copy import deepcopy

import torch
import torch.nn as nn
import torch.nn.functional as F


class MNIST(nn.Module):
    def __init__(self, model_params):
        super().__init__()
        sizes = [model_params["hidden_size"]] * model_params["depth"]
        layers, width = [], 784
        for size in sizes:
            layers.append(nn.Linear(width, size))
            width = size
        self.fc_layers = nn.ModuleList(layers)
        self.last_layer = nn.Linear(width, 10)
        self.nonlin = nn.ReLU()
        self.dropout = nn.Dropout(model_params["dropout"])

    def forward(self, inputs):
        x = torch.flatten(inputs, 1)
        for fc_layer in self.fc_layers:
            x = self.dropout(self.nonlin(fc_layer(x)))
        return self.last_layer(x)


class MNISTModel(nn.Module):
    def __init__(self, params):
        super().__init__()
        if params["runconfig"]["mode"] != "eval" and params["model"].get("compute_eval_metrics", []):
            params["model"]["compute_eval_metrics"] = []
        model_params = deepcopy(params["model"])
        dtype = half_dtype_instance.half_dtype if model_params["to_float16"] else torch.float32
        self.model = MNIST(model_params).to(dtype)
        self.loss_fn = nn.NLLLoss()
        self.accuracy_metric = None
        if model_params.get("compute_eval_metrics"):
            self.accuracy_metric = AccuracyMetric(name="accuracy")

    def forward(self, data):
        inputs, labels = data
        pred_logits = self.model(inputs)
        if self.accuracy_metric:
            self.accuracy_metric(labels=labels.clone(), predictions=pred_logits.argmax(-1).int())
        return self.loss_fn(F.log_softmax(pred_logits, dim=1), labels)
'''

MODEL_R17 = '''
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from modelzoo.common.pytorch.PyTorchBaseModel import PyTorchBaseModel
from modelzoo.common.pytorch.run_utils import half_dtype_instance
''' + MODEL_BODY.split("class MNISTModel")[0].split("import torch.nn.functional as F")[1] + '''

class MNISTModel(PyTorchBaseModel):
    def __init__(self, params, device=None):
        params = copy.deepcopy(params)
        model_params = copy.deepcopy(params["model"])
        self.model = MNIST(model_params)
        self.loss_fn = nn.NLLLoss()
        super().__init__(params=params, model=self.model, device=device)

    def __call__(self, data):
        inputs, labels = data
        return self.loss_fn(F.log_softmax(self.model(inputs), dim=1), labels)
'''

PARAMS = {
    "1.8": '''
train_input: {data_dir: "./data/mnist/train", batch_size: 8, drop_last_batch: True, shuffle: True}
eval_input: {data_dir: "./data/mnist/val", batch_size: 8, drop_last_batch: True, shuffle: False}
model: {name: "fc_mnist", mixed_precision: True, depth: 2, hidden_size: 16, dropout: 0.0, activation_fn: "relu"}
optimizer: {optimizer_type: "SGD", learning_rate: 0.01, momentum: 0.9, loss_scaling_factor: 1.0}
runconfig: {max_steps: 4, checkpoint_steps: 2, log_steps: 2, seed: 1, save_losses: True}
''',
    "1.9": '''
train_input: {data_dir: "./mnist", batch_size: 4, drop_last_batch: True, to_float16: True, shuffle: True}
eval_input: {data_dir: "./mnist", batch_size: 4, drop_last_batch: True, shuffle: False}
model: {name: "fc_mnist", mixed_precision: True, depth: 2, hidden_size: 16, dropout: 0.0, activation_fn: "relu",
        to_float16: False}
optimizer: {optimizer_type: "SGD", learning_rate: 0.01, momentum: 0.0, loss_scaling_factor: 1.0}
runconfig: {num_epochs: 1, steps_per_epoch: 4, max_steps: 100, log_steps: 2, checkpoint_steps: 1000, seed: 1,
            model_dir: "./model_dir", show_debug_metrics: False, save_losses: True}
csconfig: {use_cbfloat16: False}
''',
}
PARAMS["2.0"] = PARAMS["1.9"]
PARAMS["R1.7"] = PARAMS["1.8"]


def _layout(root: Path, release: str) -> Path:
    """modelzoo/fc_mnist/pytorch/{run,data,model,utils}.py and configs/params.yaml of one release shape."""
    pkg = root / "modelzoo" / "fc_mnist" / "pytorch"
    (pkg / "configs").mkdir(parents=True)
    for init in (root / "modelzoo", root / "modelzoo" / "fc_mnist", pkg):
        (init / "__init__.py").write_text("")
    shape = "1.8" if release == "R1.7" else release
    (pkg / "run.py").write_text(RUN_18 if shape == "1.8" else RUN_19)
    (pkg / "utils.py").write_text(UTILS)
    (pkg / "data.py").write_text(DATA_HEAD[shape] + DATA_BODY)
    (pkg / "model.py").write_text(MODEL_R17 if release == "R1.7" else MODEL_HEAD[shape] + MODEL_BODY)
    (pkg / "configs" / "params.yaml").write_text(PARAMS[release])
    return pkg


@pytest.fixture
def clean_modules():
    """Each script gets fresh vendor modules and a fresh backend (one backend type per process)."""
    from cs_run.backend import _reset_for_tests

    saved_argv, saved_path = list(sys.argv), list(sys.path)
    with _reset_for_tests():
        yield
    compat.uninstall()
    sys.argv[:], sys.path[:] = saved_argv, saved_path


@pytest.mark.parametrize("release", ["R1.7", "1.8", "1.9", "2.0"])
@pytest.mark.parametrize("device", ["CPU", "CSX"])
def test_model_zoo_run_py_unmodified(tmp_path, monkeypatch, clean_modules, release, device, caplog):
    pkg = _layout(tmp_path, release)
    monkeypatch.chdir(pkg)
    with caplog.at_level("INFO", logger="cs_run"):
        compat.run_script(str(pkg / "run.py"), [device, "--mode", "train", "--params", "configs/params.yaml",
                                                "--model_dir", "md"])
    assert (pkg / "md" / "checkpoint_4.mdl").is_file()
    assert f"Train Device={'CSX' if device == 'CSX' else 'cpu'}, Step=4" in caplog.text
    if device == "CSX" and release in ("1.9", "2.0"):  # half images, int32 labels, traced and run
        assert "float16 cpu; (4,) int32" in caplog.text or "float16 cuda" in caplog.text


def test_exec_cli_and_module_entry_point(tmp_path):
    pkg = _layout(tmp_path, "2.0")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cs_run_bin = Path(sys.executable).parent / "cs-run"
    runs = [subprocess.Popen([*cmd, "run.py", "CSX", "--mode", "train", "--params", "configs/params.yaml",
                              "--model_dir", f"md{i}"], cwd=pkg, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
            for i, cmd in enumerate(([str(cs_run_bin), "exec"], [sys.executable, "-m", "cs_run.frontends.compat"]))]
    for run in runs:  # side by side: each is one core's work, and they share nothing but the package
        _, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr
        assert "Train Device=CSX, Step=4" in stderr


SEED_001 = '''
import sys

import torch
import cerebras.pytorch as cstorch
import cerebras_pytorch.experimental.metrics as metrics

device = sys.argv[1]
cstorch.manual_seed(0)
if device == "CSX":
    cstorch.configure(model_dir="model_dir", checkpoint_steps=2)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4))
compiled_model = cstorch.compile(model, backend="wse_ws" if device == "CSX" else "CPU")
loss_fn = torch.nn.CrossEntropyLoss()
optimizer = cstorch.optim.configure_optimizer(optimizer_type="SGD", params=model.parameters(), learning_rate=0.1,
                                              momentum=0.9)
lr_scheduler = cstorch.optim.configure_lr_scheduler(optimizer, learning_rate=0.1)
accuracy = metrics.AccuracyMetric("accuracy")


def input_fn():
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g))
    return torch.utils.data.DataLoader(data, batch_size=8, drop_last=True)


@cstorch.compile_step
def training_step(batch):
    inputs, targets = batch
    outputs = compiled_model(inputs)
    loss = loss_fn(outputs, targets)
    cstorch.amp.optimizer_step(loss, optimizer, None, max_gradient_norm=1.0)
    lr_scheduler.step()
    accuracy(labels=targets.clone(), predictions=outputs.argmax(-1).int())
    return loss


losses = []


@cstorch.step_closure
def post_training_step(loss):
    losses.append(loss.item())


@cstorch.step_closure
def save_checkpoint(step):
    cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "global_step": step},
                 f"checkpoint_{step}.mdl")


dataloader = cstorch.utils.data.DataLoader(input_fn, num_steps=6)
for i, batch in enumerate(dataloader):
    post_training_step(training_step(batch))
save_checkpoint(6)
state = cstorch.load("checkpoint_6.mdl")
assert state["global_step"] == 6 and len(losses) == 6, losses
print("LOSSES", " ".join(f"{v:.6f}" for v in losses), float(accuracy))
'''


@pytest.mark.parametrize("device", ["CPU", "CSX"])
def test_seed_001_script_with_cerebras_pytorch_import(tmp_path, monkeypatch, clean_modules, capsys, device):
    script = tmp_path / "train.py"
    script.write_text(SEED_001)
    monkeypatch.chdir(tmp_path)
    compat.run_script(str(script), [device])
    out = capsys.readouterr().out
    assert (tmp_path / "checkpoint_6.mdl").is_file()
    losses = [float(v) for v in out.split("LOSSES")[1].split()[:6]]
    assert losses == pytest.approx(_eager_reference(), rel=1e-5, abs=1e-6)


def _eager_reference() -> list[float]:
    """The same six steps in plain torch: SGD(momentum 0.9), clip to norm 1, the loader's batches in order."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
    losses = []
    for step in range(6):
        i = (step % 4) * 8
        loss = torch.nn.functional.cross_entropy(model(x[i:i + 8]), y[i:i + 8])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


def test_unprovided_vendor_modules_name_themselves(clean_modules):
    compat.install()
    for name in ("modelzoo.common.pytorch.layers", "cerebras.modelzoo.common.utils.model", "cerebras_pytorch.mesh"):
        with pytest.raises(ImportError, match=rf"No module named '{name}': it is a Cerebras vendor module that "
                                              "cs-run does not provide"):
            __import__(name)


def test_the_sparse_api_resolves_to_cs_runs(clean_modules):
    compat.install()
    import cerebras.pytorch.sparse as vendor_sparse

    import cs_run.sparse

    assert vendor_sparse is cs_run.sparse and callable(vendor_sparse.configure)


def test_nothing_named_cerebras_is_installed():
    code = textwrap.dedent("""
        import importlib.util, cs_run
        assert importlib.util.find_spec("cerebras") is None
        assert importlib.util.find_spec("cerebras_pytorch") is None
        assert importlib.util.find_spec("modelzoo") is None
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr


RUN_210 = '''
import os
import sys

sys.path.append(os.path.join(os.path.dirname(__file__), "../../../../.."))

if __name__ == '__main__':
    from cerebras.modelzoo.common.run_utils import run

    run()
'''


def test_release_2_10_run_py_takes_the_model_from_the_params(tmp_path, monkeypatch, clean_modules, caplog):
    """2.10's run.py calls run() with no functions: model.name (here cs-run's bundled fc_mnist) decides."""
    from tests.vendor.helpers import write_mnist

    (tmp_path / "run.py").write_text(RUN_210)
    (tmp_path / "params.yaml").write_text(PARAMS["1.9"].replace("csconfig: {use_cbfloat16: False}\n", "")
                                          .replace('to_float16: True, shuffle: True}', 'shuffle: True, '
                                                   'split: "train", data_processor: "MNISTDataProcessor"}'))
    write_mnist(tmp_path / "mnist")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("INFO", logger="cs_run"):
        compat.run_script(str(tmp_path / "run.py"), ["CSX", "--mode", "train", "--params", "params.yaml",
                                                     "--model_dir", "md"])
    assert "MNIST IDX files" in caplog.text and (tmp_path / "md" / "checkpoint_4.mdl").is_file()
