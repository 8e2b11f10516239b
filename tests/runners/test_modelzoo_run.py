"""cs_run.run: a Model Zoo-style run.py works with only its import changed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

RUN_PY = textwrap.dedent('''
    import argparse
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from cs_run import run


    class MNISTModel(torch.nn.Module):
        """Model Zoo style: built from the whole params dict, forward(batch) returns the loss."""

        def __init__(self, params):
            super().__init__()
            self.fc = torch.nn.Linear(6, params["model"]["num_classes"])
            self.label_smoothing = params["runconfig"].get("label_smoothing", 0.0)

        def forward(self, batch):
            x, y = batch
            return F.cross_entropy(self.fc(x), y, label_smoothing=self.label_smoothing)


    def get_loader(params, key):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=params[key]["batch_size"], drop_last=True)


    def get_train_dataloader(params):
        return get_loader(params, "train_input")


    def get_eval_dataloader(params):
        return get_loader(params, "eval_input")


    def set_defaults(params):
        params["model"].setdefault("num_classes", 3)
        return params


    def extra_args():
        parser = argparse.ArgumentParser(add_help=False)
        parser.add_argument("--label_smoothing", type=float, default=0.0)
        return [parser]


    if __name__ == "__main__":
        run(MNISTModel, get_train_dataloader, get_eval_dataloader, set_defaults, extra_args)
''')

PARAMS = """
train_input: {batch_size: 8}
eval_input: {batch_size: 8}
model: {}
optimizer: {optimizer_type: SGD, learning_rate: 0.1}
runconfig: {max_steps: 6, log_steps: 3, disable_progress_bar: true, compile_tier: fx}
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "run.py").write_text(RUN_PY)
    (tmp_path / "params.yaml").write_text(PARAMS)
    return tmp_path


def run_script(project, *args):
    return subprocess.run([sys.executable, "run.py", *args], cwd=project, capture_output=True, text=True,
                          timeout=120, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                "CS_RUN_CACHE_DIR": os.environ["CS_RUN_CACHE_DIR"]})


def test_run_py_train_and_eval_with_device_word(project):
    result = run_script(project, "CPU", "--mode", "train_and_eval", "--params", "params.yaml",
                        "--model_dir", "md", "--label_smoothing", "0.1")
    assert result.returncode == 0, result.stderr
    assert "| Train Device=cpu, Step=6" in result.stderr and "eval/loss=" in result.stderr
    assert (project / "md" / "checkpoint_6.mdl").is_file()


def test_run_py_csx_train_and_eval_and_validate_only(project):
    result = run_script(project, "CSX", "--mode", "train_and_eval", "--params", "params.yaml", "--model_dir", "md")
    assert result.returncode == 0, result.stderr
    assert "| Train Device=CSX, Step=6" in result.stderr and "compile cache miss" in result.stderr
    assert "| Eval Device=CSX" in result.stderr
    check = run_script(project, "CSX", "--mode", "train", "--params", "params.yaml", "--model_dir", "md2",
                       "--validate_only")
    assert check.returncode == 0, check.stderr
    assert "validate-only passed: the train step traced" in check.stderr and check.stderr.count("graph:") == 1
    assert not list((project / "md2").glob("checkpoint_*"))


def test_run_in_process_flat_form_and_errors(project, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.chdir(project)
    sys.modules.pop("run", None)
    import run as script

    args = ["--mode", "train", "--params", "params.yaml", "--model_dir", "md2", "--device", "CPU"]
    assert script.run(script.MNISTModel, script.get_train_dataloader, script.get_eval_dataloader,
                      script.set_defaults, script.extra_args, argv=args) == {}
    assert (project / "md2" / "checkpoint_6.mdl").is_file()
    with pytest.raises(SystemExit) as exit_info:
        script.run(script.MNISTModel, argv=["CPU", "--mode", "train", "--params", "params.yaml",
                                            "--set", "runconfig.log_stesp=1"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:  # argparse usage error
        script.run(script.MNISTModel, argv=["TPU", "--mode", "train", "--params", "params.yaml"])
    assert exit_info.value.code == 2
    sys.modules.pop("run", None)
