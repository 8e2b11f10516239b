"""fc_mnist: the IDX reader, the bundled-digits fallback, the model, and training to >= 90% accuracy."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from cs_run.data.processors import mnist as data
from cs_run.models.fc_mnist import model


def write_idx(path, array: np.ndarray, compress=False):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        payload = gzip.compress(payload)
    path.write_bytes(payload)


@pytest.mark.parametrize("compress", [False, True])
def test_idx_files_are_read_and_normalized(tmp_path, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 28, 28))
    labels = np.array([3, 1, 4, 1, 5])
    write_idx(tmp_path / "train-images-idx3-ubyte", images, compress)
    write_idx(tmp_path / "train-labels-idx1-ubyte", labels, compress)
    x, y = data.load_mnist_idx(tmp_path, "train")
    assert x.shape == (5, 1, 28, 28) and y.tolist() == labels.tolist()
    expected = (torch.tensor(images, dtype=torch.float32) / 255.0 - data.MNIST_MEAN) / data.MNIST_STD
    torch.testing.assert_close(x[:, 0], expected)
    assert data.load_mnist_idx(tmp_path, "eval") is None  # no t10k files


def test_truncated_idx_file_is_an_error(tmp_path):
    write_idx(tmp_path / "f", np.zeros((4, 28, 28)))
    (tmp_path / "f").write_bytes((tmp_path / "f").read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated IDX file"):
        data.read_idx(tmp_path / "f")
    (tmp_path / "g").write_bytes(b"not an idx file")
    with pytest.raises(ValueError, match="bad magic number"):
        data.read_idx(tmp_path / "g")


def test_digits_fallback_is_a_fixed_disjoint_split():
    train_x, train_y = data.load_digits_as_mnist("train")
    eval_x, eval_y = data.load_digits_as_mnist("eval")
    assert train_x.shape == (1500, 1, 28, 28) and eval_x.shape == (297, 1, 28, 28)
    assert set(train_y.tolist()) == set(range(10))
    # Same 28x28 geometry as MNIST: the 4-pixel border is background.
    background = (0 - data.MNIST_MEAN) / data.MNIST_STD
    assert torch.allclose(train_x[:, :, :4, :], torch.tensor(background))
    again_x, _ = data.load_digits_as_mnist("eval")
    assert torch.equal(eval_x, again_x)


def _reference_loss(m, x, y, *, relu: bool, softmax: bool = True) -> torch.Tensor:
    """The Model Zoo 2.10 fc_mnist forward by hand (its model.py: MNIST.forward, MNISTModel.forward): each
    hidden Linear, then the activation if one is set, then dropout (0 here); the last Linear; NLL of
    log-softmax unless disable_softmax."""
    h = x.flatten(1)
    for layer in m.model.fc_layers:
        h = torch.nn.functional.linear(h, layer.weight, layer.bias)
        h = torch.relu(h) if relu else h
    logits = torch.nn.functional.linear(h, m.model.last_layer.weight, m.model.last_layer.bias)
    return torch.nn.functional.nll_loss(torch.log_softmax(logits, 1) if softmax else logits, y)


# What a params file that leaves a key unset gets: Model Zoo 2.10 MNISTConfig / MNISTModelConfig
# (src/cerebras/modelzoo/models/vision/fc_mnist/model.py): use_bias True, activation_fn None, dropout 0,
# disable_softmax False, compute_eval_metrics False, to_float16 False.
def test_unset_keys_build_the_model_zoo_2_10_model():
    torch.manual_seed(0)
    m = model.build_model(depth=2, hidden_size=16)
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    assert m.model.nonlin is None and m.model.dropout.p == 0.0  # no activation: a linear model
    assert all(layer.bias is not None for layer in [*m.model.fc_layers, m.model.last_layer])
    torch.testing.assert_close(m((x, y)), _reference_loss(m, x, y, relu=False))
    assert not _has_metric(m)  # no eval metrics: an eval reports eval/loss only
    assert m.model.last_layer.weight.dtype == torch.float32


def _has_metric(m) -> bool:
    from cs_run.metrics import Metric

    return any(isinstance(x, Metric) for x in vars(m).values()) or m.accuracy is not None


@pytest.mark.parametrize("keys", [{"activation_fn": "relu"}, {"use_bias": False}, {"disable_softmax": True},
                                  {"activation_fn": "relu", "compute_eval_metrics": True},
                                  {"compute_eval_metrics": ["accuracy"]}, {"compute_eval_metrics": []}])
def test_the_model_zoo_keys_set(keys):
    torch.manual_seed(0)
    m = model.build_model(depth=2, hidden_size=16, **keys)
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    assert all((layer.bias is not None) == keys.get("use_bias", True) for layer in [*m.model.fc_layers,
                                                                                    m.model.last_layer])
    m.eval()
    torch.testing.assert_close(m((x, y)), _reference_loss(m, x, y, relu="activation_fn" in keys,
                                                          softmax=not keys.get("disable_softmax")))
    assert (m.accuracy is not None) == bool(keys.get("compute_eval_metrics"))
    if m.accuracy is not None:
        logits = m.model(x)
        assert m.accuracy.compute() == pytest.approx((logits.argmax(-1) == y).float().mean().item())


def test_an_activation_other_than_the_known_ones_is_an_error():
    with pytest.raises(ValueError, match="activation_fn: unknown 'swish'; expected one of relu, .* or null"):
        model.build_model(depth=1, hidden_size=4, activation_fn="swish")
    with pytest.raises(ValueError, match=r"compute_eval_metrics: fc_mnist computes accuracy only, got \['f1'\]"):
        model.build_model(depth=1, hidden_size=4, compute_eval_metrics=["f1"])


def test_the_model_zoo_params_file_trains_its_model(tmp_path):
    # Model Zoo 2.10 configs/params.yaml's model section sets activation_fn: relu and leaves
    # compute_eval_metrics unset: a ReLU network whose eval reports no accuracy. The bundled params set both.
    from cs_run.frontends.cli import default_params_path
    from cs_run.params import load_params
    from cs_run.resolve import resolve_params
    from cs_run.runners._build import build_model

    (tmp_path / "params.yaml").write_text(
        "model:\n  name: fc_mnist\n  mixed_precision: true\n  depth: 10\n  hidden_size: 50\n  dropout: 0.0\n"
        "  activation_fn: relu\n  to_float16: false\n")
    params = load_params(tmp_path / "params.yaml")
    resolve_params(params)
    m = build_model(params)
    assert isinstance(m.model.nonlin, torch.nn.ReLU) and m.accuracy is None and len(m.model.fc_layers) == 10
    bundled_params = load_params(default_params_path())
    resolve_params(bundled_params)
    bundled = build_model(bundled_params)
    assert isinstance(bundled.model.nonlin, torch.nn.ReLU) and bundled.accuracy is not None


def test_bundled_params_train_to_90_percent(tmp_path):
    from cs_run.frontends.cli import default_params_path
    from cs_run.params import load_params
    from cs_run.runners import PyTorchBaseRunner

    params = load_params(default_params_path(), {"runconfig.model_dir": str(tmp_path / "md"),
                                                 "runconfig.disable_progress_bar": True})
    results = PyTorchBaseRunner.create(params).run("train_and_eval")
    assert results["eval/accuracy"] >= 0.90


@pytest.mark.parametrize("keys, missing", [({}, "model.depth and model.hidden_size"), ({"depth": 2}, "model.hidden_size"),
                                           ({"hidden_size": 16}, "model.depth")])
def test_the_layer_sizes_are_required_as_in_the_model_zoo(keys, missing):
    # The Model Zoo's MNISTConfig.post_init: "hidden_size and depth, or hidden_sizes must be provided".
    with pytest.raises(ValueError, match=rf"fc_mnist needs its layer sizes: .* missing {missing} "):
        model.build_model(**keys)


def test_hidden_sizes_takes_precedence_as_in_the_model_zoo():
    m = model.build_model(hidden_sizes=[32, 16], depth=5, hidden_size=7)
    shapes = [tuple(layer.weight.shape) for layer in [*m.model.fc_layers, m.model.last_layer]]
    assert shapes == [(32, 784), (16, 32), (10, 16)]  # the vendor's layers: 784 -> each size -> 10
    with pytest.raises(ValueError, match=r"hidden_sizes: every size must be an integer >= 1, got \[32, 0\]"):
        model.build_model(hidden_sizes=[32, 0])


def test_a_trainer_or_params_file_without_the_sizes_is_one_error_before_any_work(tmp_path):
    from click.testing import CliRunner

    import cs_run
    from cs_run.errors import ParamsError
    from cs_run.frontends.cli import cli

    trainer = cs_run.Trainer(device="CPU", model_dir=str(tmp_path / "md"), model={"name": "fc_mnist"},
                             optimizer={"optimizer_type": "SGD", "learning_rate": 0.05}, loop={"num_steps": 2})
    with pytest.raises(ParamsError, match="missing model.depth and model.hidden_size"):
        trainer.fit({"batch_size": 8, "data_dir": "bundled:digits"})
    assert not (tmp_path / "md").exists()
    params = tmp_path / "params.yaml"
    params.write_text("train_input:\n  data_dir: bundled:digits\n  batch_size: 8\nmodel:\n  name: fc_mnist\n"
                      "  dropout: 0.0\noptimizer:\n  optimizer_type: SGD\n  learning_rate: 0.05\nrunconfig:\n  max_steps: 2\n")
    result = CliRunner().invoke(cli, ["train", "--params", str(params), "--model_dir", str(tmp_path / "md")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("Error: params: model: fc_mnist needs its layer sizes") and lines[0].endswith(
        f"({params}:4)")
    assert not (tmp_path / "md").exists()


def test_a_trainer_optimizer_section_without_learning_rate_is_an_error(tmp_path):
    import cs_run
    from cs_run.errors import ParamsError

    with pytest.raises(ParamsError, match="Trainer: optimizer section needs 'learning_rate'"):
        cs_run.Trainer(device="CPU", model_dir=str(tmp_path / "md"), model={"name": "fc_mnist", "depth": 1,
                                                                            "hidden_size": 8},
                       optimizer={"optimizer_type": "SGD", "momentum": 0.9})
