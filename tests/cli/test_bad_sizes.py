"""Model sizes no memory can hold are refused before the model is built (runners/_memory.py).

A table of size keys by class, not by example: each size key of fc_mnist and gpt2 far too large, sizes
that are each moderate but whose product is not, lists of sizes, int64 overflow, negative, zero and
float sizes, and N replicas of a model that fits once. For every case: the exit code, exactly one
``Error:`` line naming the key (at its file:line, or on the command line) and what to do, no traceback,
no real model built, and nothing written to model_dir. The table runs against a stated 1 GiB of memory
(the same verdicts on any machine, and a deep model is stopped after 1 GiB of meta layers, not after
the host's tens of GiB); one test uses the host's own number. The boundary is checked against a hand
count of the bytes.
"""

from __future__ import annotations

import dataclasses
import logging
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cs_run import replicas
from cs_run.frontends.cli import cli
from cs_run.runners import _memory
from tests.cli.test_bad_inputs import _line_of, _set_line, _snapshot

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclasses.dataclass
class Case:
    id: str
    example: str                  # fc_mnist or gpt2 (its bundled params file, copied)
    key: str                      # the params key the message names first
    value: str                    # its YAML value
    message: str                  # a part of the one Error: line
    code: int = 2
    more: dict = dataclasses.field(default_factory=dict)  # other keys to set: {"model.depth": "3"}
    args: tuple = ()              # extra CLI arguments
    on_command_line: bool = False  # the key is set by a flag, so the line says "(set on the command line)"


TOO_BIG = "the model needs"
STATED = 1 << 30
CASES = [
    # each size of each example at an absurd value (the list)
    Case("fc_mnist-hidden_size-1e9", "fc_mnist", "model.hidden_size", "1000000000", TOO_BIG),
    Case("fc_mnist-depth-1e6", "fc_mnist", "model.depth", "1000000", TOO_BIG),
    Case("gpt2-hidden_size-1e9", "gpt2", "model.hidden_size", "1000000000", TOO_BIG),
    # the Model Zoo caps vocab_size at 512000 (GPT2LMHeadModelConfig): the model's own range, still one line
    Case("gpt2-vocab_size-1e9", "gpt2", "model.vocab_size", "1000000000", "vocab_size: must be <= 512000"),
    Case("gpt2-vocab_size-at-the-cap", "gpt2", "model.hidden_size", "1000000", TOO_BIG,
         more={"model.vocab_size": "512000"}),
    Case("gpt2-filter_size-1e9", "gpt2", "model.filter_size", "1000000000", TOO_BIG),
    Case("gpt2-max_position_embeddings-1e9", "gpt2", "model.max_position_embeddings", "1000000000", TOO_BIG),
    Case("gpt2-num_hidden_layers-1e6", "gpt2", "model.num_hidden_layers", "1000000", TOO_BIG),
    # neighbours: moderate sizes with an absurd product, a list of sizes, more elements than int64 counts
    Case("fc_mnist-product-of-moderate-sizes", "fc_mnist", "model.hidden_size", "200000", TOO_BIG,
         more={"model.depth": "1000"}),
    Case("fc_mnist-hidden_size-list", "fc_mnist", "model.hidden_size", "[100, 2000000000, 10]", TOO_BIG),
    Case("fc_mnist-hidden_sizes", "fc_mnist", "model.hidden_sizes", "[3000000000, 3000000000]", TOO_BIG),
    Case("fc_mnist-int64-overflow", "fc_mnist", "model.hidden_size", "10000000000", TOO_BIG,
         more={"model.depth": "3"}),
    Case("gpt2-embedding-overflow", "gpt2", "model.hidden_size", "100000000000", TOO_BIG,
         more={"model.vocab_size": "500000"}),
    # negative, zero and float sizes: the model function's or the signature's own refusal, still one line
    Case("fc_mnist-hidden_size-negative", "fc_mnist", "model.hidden_size", "-5", "hidden_size: must be >= 1"),
    Case("fc_mnist-hidden_size-zero", "fc_mnist", "model.hidden_size", "0", "hidden_size: must be >= 1"),
    Case("fc_mnist-depth-negative", "fc_mnist", "model.depth", "-1", "depth: must be >= 0"),
    Case("fc_mnist-hidden_sizes-negative", "fc_mnist", "model.hidden_sizes", "[10, -3]", "every size must be"),
    Case("gpt2-vocab_size-negative", "gpt2", "model.vocab_size", "-1", "vocab_size: must be >= 1"),
    Case("gpt2-num_hidden_layers-negative", "gpt2", "model.num_hidden_layers", "-2", "must be >= 0"),
    Case("gpt2-hidden_size-float", "gpt2", "model.hidden_size", "128.5", "model.hidden_size: expected an integer"),
    Case("gpt2-vocab_size-float-1e9", "gpt2", "model.vocab_size", "1.0e+9", "model.vocab_size: expected an integer"),
    # replicas: a model that fits once, not 64 times; the flag is named where it was given
    Case("fc_mnist-64-replicas", "fc_mnist", "runconfig.num_csx", "64", "64 replicas need",
         more={"model.hidden_size": "500", "model.depth": "20"}, args=("--num_csx", "64"),
         on_command_line=True),
]


def _params_text(case: Case) -> str:
    text = (EXAMPLES / case.example / "params.yaml").read_text()
    for key, value in {case.key: case.value, **case.more}.items():
        if case.on_command_line and key == case.key:
            continue
        section, name = key.split(".")
        text = _set_line(text, section, name, value)
    if "hidden_sizes" in case.key:  # fc_mnist: hidden_sizes wins over depth x hidden_size
        text = _set_line(text, "model", "depth", "null")
    return text


def test_the_table_covers_every_size_key_of_both_examples():
    keys = {(c.example, c.key) for c in CASES}
    assert {("fc_mnist", "model.hidden_size"), ("fc_mnist", "model.depth"), ("fc_mnist", "model.hidden_sizes"),
            ("gpt2", "model.hidden_size"), ("gpt2", "model.vocab_size"), ("gpt2", "model.filter_size"),
            ("gpt2", "model.max_position_embeddings"), ("gpt2", "model.num_hidden_layers")} <= keys
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_absurd_size_is_one_line_before_anything_is_built(case, tmp_path, monkeypatch):
    params = tmp_path / "params.yaml"
    text = _params_text(case)
    params.write_text(text)
    md = tmp_path / "md"
    md.mkdir()
    (md / "notes.txt").write_text("the user's file")
    before = _snapshot(md)
    monkeypatch.setattr(_memory, "available_memory", lambda device: (STATED, "a stated amount"))
    allocated = []
    monkeypatch.setattr(torch.nn.Linear, "reset_parameters",  # a real (non-meta) build would be recorded
                        lambda self, real=torch.nn.Linear.reset_parameters: (
                            allocated.append(self.weight.device) if not self.weight.is_meta else None,
                            real(self))[1])
    result = CliRunner().invoke(cli, ["train", "--params", str(params), "--model_dir", str(md), *case.args])
    lines = [line for line in result.output.splitlines() if line.strip() and " INFO: " not in line]
    assert result.exit_code == case.code, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert case.message in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert case.key.split(".")[-1] in lines[0], lines[0]
    where = "(set on the command line)" if case.on_command_line else f"({params}:{_line_of(text, case.key)})"
    assert lines[0].endswith(where), (lines[0], where)
    assert allocated == [], "the real model was built"
    assert _snapshot(md) == before


def test_the_message_names_the_bytes_needed_and_available(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(_params_text(CASES[0]))
    result = CliRunner().invoke(cli, ["train", "--params", str(params), "--model_dir", str(tmp_path / "md")])
    line = result.output.strip().splitlines()[-1]
    host = _memory.available_memory(torch.device("cpu"))
    assert host is not None
    assert line.startswith("Error: params: model.hidden_size: the model needs more memory than there is: its "
                           "parameters alone pass the "), line
    assert f"({host[1]}); make its sizes smaller (the largest: model.hidden_size=1000000000, model.depth=2)" in line
    assert not (tmp_path / "md").exists()


# ------------------------------------------------------------------------------- the boundary, counted

MODULE = textwrap.dedent('''
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    class Sized(torch.nn.Module):
        def __init__(self, hidden, width):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.BatchNorm1d(hidden),
                                           torch.nn.Linear(hidden, 1))

        def forward(self, batch):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)


    def build_model(hidden: int = 8, width: int = 6):
        return Sized(hidden, width)


    def build_data(split, batch_size=4):
        x = torch.randn(16, 6)
        return DataLoader(TensorDataset(x, x[:, :1]), batch_size=batch_size, drop_last=True)
''')

SIZED_PARAMS = textwrap.dedent("""\
    train_input:
      data_fn: "sized_models:build_data"
      batch_size: 4
    model:
      name: "sized_models:build_model"
      hidden: 1000
    optimizer:
      optimizer_type: {optimizer}
      learning_rate: 0.1
    {momentum}runconfig:
      max_steps: 1
      disable_progress_bar: true
    """)


def _hand_count(hidden: int, width: int = 6, *, states: int, scalars: int = 0) -> int:
    """float32 bytes of Linear(width, hidden) + BatchNorm1d(hidden) + Linear(hidden, 1), counted by hand:
    weights + biases, BatchNorm's weight and bias (trainable) and running mean and var (float32) plus its
    int64 batch count; gradients of the trainable ones; ``states`` optimizer tensors of each trainable
    tensor's shape and ``scalars`` float32 scalars per trainable tensor (Adam's beta1_power, beta2_power)."""
    trainable = (width * hidden + hidden) + (2 * hidden) + (hidden + 1)
    buffers = 2 * hidden * 4 + 8
    return trainable * 4 * (2 + states) + buffers + 6 * scalars * 4


@pytest.mark.parametrize("optimizer, states, scalars", [("SGD", 0, 0), ("SGD-momentum", 1, 0), ("Adam", 2, 2)])
def test_the_limit_is_the_hand_counted_bytes(optimizer, states, scalars, tmp_path, monkeypatch):
    """One byte less than the hand count is refused, the hand count trains. Without optimizer state the
    weights and gradients alone pass the limit, so the meta build stops there ("more memory than there is")."""
    (tmp_path / "sized_models.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    params = tmp_path / "params.yaml"
    params.write_text(SIZED_PARAMS.format(optimizer=optimizer.split("-")[0],
                                          momentum="  momentum: 0.9\n" if "momentum" in optimizer else ""))
    needed = _hand_count(1000, states=states, scalars=scalars)
    expected = (f"the model needs at least {_memory.format_bytes(needed)} of memory" if states else
                "the model needs more memory than there is: its parameters alone pass the")
    for available, refused in ((needed - 1, True), (needed, False)):
        monkeypatch.setattr(_memory, "available_memory", lambda device, n=available: (n, "a stated amount"))
        md = tmp_path / f"md{available}"
        result = CliRunner().invoke(cli, ["train", "--params", str(params), "--model_dir", str(md)])
        if refused:
            assert result.exit_code == 2, result.output
            line = result.output.strip().splitlines()[-1]
            assert line.startswith(f"Error: params: model.hidden: {expected}"), line
            assert line.endswith(f"(a stated amount); make its sizes smaller (the largest: model.hidden=1000) "
                                 f"({params}:6)") and not md.exists()
        else:
            assert result.exit_code == 0, result.output


def test_a_meta_build_leaves_no_metric_random_draw_or_log_line(caplog):
    from cs_run.metrics import AccuracyMetric, get_all_metrics

    made = []

    def build():
        logging.getLogger("cs_run.user").warning("building")
        torch.rand(1)  # a draw from the default generator on the meta device: none
        made.append(AccuracyMetric("eval/sized_accuracy"))
        return torch.nn.Sequential(torch.nn.Linear(3, 4), made[-1])

    before = torch.get_rng_state()
    with caplog.at_level(logging.DEBUG):
        size = _memory.measure_model(build, None, training=True, limit=None)
    assert size == _memory.ModelSize(weights=(3 * 4 + 4) * 4 + sum(
        t.numel() * t.element_size() for t in made[0].buffers()), gradients=(3 * 4 + 4) * 4)
    assert "eval/sized_accuracy" not in dict(get_all_metrics())
    assert torch.equal(torch.get_rng_state(), before)
    assert not [r for r in caplog.records if r.getMessage() == "building"]


def test_a_model_built_earlier_is_not_counted_again():
    model = torch.nn.Linear(1000, 1000)
    assert _memory.measure_model(lambda: model, None, training=True, limit=None) is None


def test_a_build_that_fails_on_the_meta_device_is_left_to_the_real_build():
    def build():
        layer = torch.nn.Linear(3, 3)
        float(layer.weight.sum())  # a host read: meta tensors have no values
        return layer

    assert _memory.measure_model(build, None, training=False, limit=None) is None


def test_a_deep_model_is_stopped_once_it_passes_the_limit():
    """1e6 layers of 64 KiB: stopped at the limit (about 1,000 layers in), not after building them all."""
    size = _memory.measure_model(lambda: torch.nn.Sequential(*(torch.nn.Linear(128, 128) for _ in range(10 ** 6))),
                                 None, training=False, limit=64 << 20)
    assert size is not None and size.exceeded and size.weights > 64 << 20
    assert size.weights <= (64 << 20) + (128 * 128 + 128) * 4  # the layer that passed it is the last one built


# ------------------------------------------------------------------------------- replicas and cores

def test_more_replicas_than_cores_is_a_warning_before_the_launch(monkeypatch, caplog):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    with caplog.at_level(logging.WARNING, logger="cs_run"), pytest.raises(Exception, match="not possible from"):
        replicas.launch(64)  # inside pytest the launch itself is refused, after the warning
    assert any("64 replicas on 2 CPU cores" in r.getMessage() for r in caplog.records)


def test_replicas_that_fit_together_pass_the_check(tmp_path, monkeypatch):
    """Each replica is a process (stated here: 1 MiB, the launcher's resident size in a run) plus its model
    (the hand count): 4 of them fit in 4 x that, 5 do not."""
    (tmp_path / "sized_models.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    params = tmp_path / "params.yaml"
    params.write_text(SIZED_PARAMS.format(optimizer="SGD", momentum=""))
    each = (1 << 20) + _hand_count(1000, states=0)
    monkeypatch.setattr(_memory, "_resident_bytes", lambda: 1 << 20)
    monkeypatch.setattr(_memory, "available_memory", lambda device: (4 * each, "a stated amount"))
    ok = CliRunner().invoke(cli, ["train", "--params", str(params), "--model_dir", str(tmp_path / "a"),
                                  "--num_csx", "4"])
    assert "replicas need" not in ok.output and "not possible from" in ok.output  # the launch's own refusal
    refused = CliRunner().invoke(cli, ["train", "--params", str(params), "--model_dir", str(tmp_path / "b"),
                                       "--num_csx", "5"])
    assert refused.exit_code == 2
    line = refused.output.strip().splitlines()[-1]
    assert line.startswith(f"Error: params: runconfig.num_csx: 5 replicas need {_memory.format_bytes(5 * each)} of "
                           f"memory, {_memory.format_bytes(each)} each (a process the size of this one, 1.0 MiB, "
                           "and a model of "), line
    assert line.endswith("(a stated amount); run fewer replicas, at most 4 (set on the command line)"), line
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_negative_size_in_a_model_without_checks_is_named(tmp_path, monkeypatch):
    """A model function that passes a size key on unchecked: torch's "negative dimension" from the meta
    build becomes one line naming the negative key at its line, before the real model is built."""
    (tmp_path / "sized_models.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    params = tmp_path / "params.yaml"
    params.write_text(SIZED_PARAMS.format(optimizer="SGD", momentum="").replace("hidden: 1000", "hidden: -5"))
    result = CliRunner().invoke(cli, ["train", "--params", str(params), "--model_dir", str(tmp_path / "md")])
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: params: model.hidden: a size is negative (Trying to create tensor with negative "
                           "dimension -5"), line
    assert line.endswith(f"sizes are positive integers ({params}:6)") and not (tmp_path / "md").exists()
    assert "Traceback" not in result.output
