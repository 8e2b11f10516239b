"""cs_run.Trainer: the seed-003 device/backend rules, fit/validate on CPU and CSX, the YAML form."""

from __future__ import annotations

import pytest
import torch
import trainer_toys
import yaml
from torch.utils.data import DataLoader, TensorDataset
from trainer_toys import toy_data

import cs_run
from cs_run.backend import _reset_for_tests
from cs_run.frontends.trainer import Trainer, trainers_from_config


class WithLoss(trainer_toys.WithLoss):
    """The toy classifier with a dropout of 0.1 before its head."""

    def __init__(self):
        super().__init__(dropout=0.1)


def loader(seed=0, n=32):
    return DataLoader(toy_data(seed, n), batch_size=4, shuffle=False, drop_last=True)


def test_device_and_backend_are_mutually_exclusive():
    backend = cs_run.backend("CPU")
    with pytest.raises(ValueError) as err:
        Trainer(device="CPU", backend=backend, model=WithLoss())
    assert str(err.value) == ("backend and device are mutually exclusive arguments of Trainer. "
                              "Please only provide one or the other")


def test_one_backend_type_per_process_but_other_options_may_change(tmp_path):
    backend = cs_run.backend("CSX", cluster_config=cs_run.distributed.ClusterConfig(num_csx=4))
    Trainer(backend=backend, model=WithLoss(), model_dir=str(tmp_path / "a"))
    backend.cluster_config.num_csx = 2
    backend.cluster_config.num_workers_per_csx = 1
    second = Trainer(backend=backend, model=WithLoss(), model_dir=str(tmp_path / "b"))
    assert second._runconfig.num_csx == 2
    with pytest.raises(RuntimeError) as err:
        Trainer(device="CPU", model=WithLoss())
    assert str(err.value) == ("Cannot instantiate multiple backends. A backend with type CSX has already been "
                              "instantiated.")


def fit(device, model_dir):
    with _reset_for_tests():
        model = WithLoss()
        optimizer = cs_run.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        trainer = Trainer(device=device, model_dir=str(model_dir), model=model, optimizer=optimizer,
                          loop={"num_steps": 12}, checkpoint={"steps": 6}, logging={"log_steps": 4}, seed=1)
        results = trainer.fit(loader(), loader(seed=1))
        return {k: v.clone() for k, v in model.state_dict().items()}, results, trainer


def test_fit_on_cpu_and_csx_agree_bit_for_bit(tmp_path):
    cpu_weights, cpu_results, cpu = fit("CPU", tmp_path / "cpu")
    csx_weights, csx_results, csx = fit("CSX", tmp_path / "csx")
    assert type(cpu.runner).__name__ == "PyTorchRunner" and type(csx.runner).__name__ == "PyTorchCSRunner"
    for key, value in cpu_weights.items():
        torch.testing.assert_close(csx_weights[key], value, rtol=0, atol=0)
    assert csx_results["eval/loss"] == cpu_results["eval/loss"]
    assert sorted(p.name for p in (tmp_path / "csx").glob("checkpoint_*")) == ["checkpoint_12.mdl", "checkpoint_6.mdl"]


def test_validate_loads_the_newest_checkpoint(tmp_path):
    weights, results, _ = fit("CPU", tmp_path / "md")
    fresh = WithLoss()
    again = Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=fresh).validate(loader(seed=1))
    assert again["eval/loss"] == pytest.approx(results["eval/loss"], rel=1e-6)
    for key, value in weights.items():
        torch.testing.assert_close(fresh.state_dict()[key], value, rtol=0, atol=0)


def test_unknown_trainer_keys_are_named():
    with pytest.raises(ValueError, match=r"Trainer: loop.num_stpes; did you mean 'num_steps'"):
        Trainer(device="CPU", model=WithLoss(), loop={"num_stpes": 3})


@pytest.mark.parametrize("section, message", [
    ({"optimizer_type": "SGD", "momentum": 0.9}, r"Trainer: optimizer section needs 'learning_rate'"),
    ({"learning_rate": 0.1}, r"Trainer: optimizer section needs 'optimizer_type'"),
    ({"optimizer_type": "SGD", "learning_rate": -0.1}, r"optimizer.learning_rate: must be >= 0, got -0.1 \(Trainer arguments\)"),
    ({"optimizer_type": "SGD", "learning_rate": "fast"}, r"optimizer.learning_rate: expected .*, got str 'fast' \(Trainer arguments\)"),
    ({"optimizer_type": "SGD", "learning_rate": 0.1, "grad_accum_steps": 0}, r"optimizer.grad_accum_steps: must be >= 1"),
])
def test_an_optimizer_section_is_checked_as_a_params_files_is(section, message, tmp_path):
    # A params file's optimizer section refuses the same values (tests/params); the Trainer's never trains
    # silently with a learning rate of 0 or a negative one.
    with pytest.raises(ValueError, match=message):
        Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=WithLoss(), optimizer=section)
    assert not (tmp_path / "md").exists()


def test_loader_and_optimizer_arguments_of_the_wrong_kind_name_the_argument(tmp_path):
    model = WithLoss()
    with pytest.raises(ValueError, match=r"Trainer: optimizer must be a torch.optim.Optimizer, a callable .* got str 'SGD'"):
        Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=model, optimizer="SGD")
    trainer = Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=model, loop={"num_steps": 2},
                      optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r"^Trainer.fit: train_dataloader: expected a torch.utils.data.DataLoader, .* got list"):
        trainer.fit([1, 2, 3])
    with pytest.raises(ValueError, match=r"^Trainer.fit: train_dataloader: expected .* got NoneType"):
        trainer.fit(None)
    with pytest.raises(ValueError, match=r"^Trainer.fit: val_dataloader: expected .* got str"):
        trainer.fit(loader(), "val.h5")
    with pytest.raises(ValueError, match=r"^Trainer.validate: val_dataloader: expected .* got NoneType"):
        trainer.validate(None)
    assert not (tmp_path / "md").exists()


@pytest.mark.parametrize("model_dir", ["", "  "])
def test_an_empty_model_dir_is_refused(model_dir, tmp_path, monkeypatch):
    """'' would be the current folder: the run's checkpoints and logs among whatever is there."""
    monkeypatch.chdir(tmp_path)
    model = WithLoss()
    with pytest.raises(ValueError, match=r"^Trainer: model_dir: an empty path \(it would be the current folder\)"):
        Trainer(device="CPU", model_dir=model_dir, model=model, optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argument, value, message", [
    ("loop", 5, r"Trainer: loop must be a dict such as \{'num_steps': 100, 'eval_frequency': 10\}, got int 5"),
    ("checkpoint", True, r"Trainer: checkpoint must be a dict .*, got bool True"),
    ("precision", "bf16", r"Trainer: precision must be a dict .*, got str 'bf16'"),
    ("logging", "DEBUG", r"Trainer: logging must be a dict .* or an int \(log_steps\), got str 'DEBUG'"),
    ("runner", 3, r"Trainer: runner must be a runner class or 'module:Class', got int 3"),
    ("schedulers", 5, r"Trainer: schedulers must be an LR scheduler, a callable \(optimizer\) -> scheduler or a list "
                      r"of them, got int 5"),
])
def test_an_argument_of_the_wrong_kind_is_named(argument, value, message, tmp_path):
    model = WithLoss()
    with pytest.raises(ValueError, match=message):
        Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=model,
                optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1), **{argument: value})


@pytest.mark.parametrize("device, arguments, message", [
    ("CPU", {"sharding": "zero3"}, r"^Trainer: sharding: 'zero3' is not one of none, fsdp$"),
    ("CPU", {"offload": "gpu"}, r"^Trainer: offload: 'gpu' is not one of none, cpu$"),
    ("CPU", {"sharding": 3}, r"^Trainer: sharding: expected a string, got int 3$"),
    ("CSX", {"sharding": "fsdp"}, r"^Trainer: sharding: fsdp with device CSX: the CSX engine traces data-parallel "
                                  r"steps only .*; use device CPU or GPU, or sharding: none and offload: none$"),
    ("CSX", {"offload": "cpu"}, r"^Trainer: offload: cpu with device CSX: "),
])
def test_sharding_and_offload_the_backend_cannot_run_are_refused_when_the_trainer_is_made(device, arguments, message,
                                                                                         tmp_path):
    model = WithLoss()
    with _reset_for_tests(), pytest.raises(ValueError, match=message):
        Trainer(device=device, model_dir=str(tmp_path / "md"), model=model,
                optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1), **arguments)
    assert not (tmp_path / "md").exists()


def test_fit_takes_a_cstorch_dataloader_and_builds_it_once(tmp_path):
    calls = []

    def input_fn():
        calls.append(1)
        return loader()

    model = WithLoss()
    trainer = Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=model, loop={"num_steps": 2},
                      optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1))
    trainer.fit(cs_run.utils.data.DataLoader(input_fn))
    assert len(calls) == 1 and trainer.runner.global_step == 2


CONFIG = """
trainer:
  init:
    device: "CPU"
    model_dir: "{model_dir}"
    seed: 1
    model: {{name: fc_mnist, depth: 1, hidden_size: 32, activation_fn: relu, compute_eval_metrics: true}}
    optimizer: {{optimizer_type: SGD, learning_rate: 0.05, momentum: 0.9}}
    loop: {{num_steps: 60}}
    logging: {{log_steps: 30}}
  fit:
    train_dataloader: {{batch_size: 64, shuffle: true}}
    val_dataloader: {{batch_size: 99, shuffle: false}}
"""


def test_yaml_form_trains_a_registered_model(tmp_path):
    config = yaml.safe_load(CONFIG.format(model_dir=tmp_path / "md"))
    [(trainer, sections)] = trainers_from_config(config)
    results = trainer.fit(**sections["fit"])
    assert results["eval/accuracy"] > 0.8


@pytest.mark.parametrize("section, message", [
    ({"init": {"devic": "CPU", "model": {"name": "fc_mnist"}}}, r"trainer\[0\].init.devic; did you mean 'device'"),
    ({"init": "CPU"}, r"trainer\[0\].init: expected a mapping of Trainer arguments, got str"),
    ({"init": {"device": "CPU", "model": {"name": "fc_mnist"}}, "fit": 3},
     r"trainer\[0\].fit: expected a mapping of dataloader sections, got int"),
])
def test_yaml_form_of_the_wrong_shape_names_the_key(section, message):
    with pytest.raises(ValueError, match=message):
        trainers_from_config({"trainer": section})


def test_yaml_form_rejects_mixed_device_types(tmp_path):
    invalid = [{"trainer": {"init": {"device": "CSX", "model": {"name": "fc_mnist"}}}},
               {"trainer": {"init": {"device": "CPU", "model": {"name": "fc_mnist"}}}}]
    with pytest.raises(RuntimeError, match="Cannot instantiate multiple backends. A backend with type CSX"):
        trainers_from_config(invalid)


def test_validate_only_backend_traces_without_training(tmp_path):
    model = WithLoss()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    backend = cs_run.backend("CSX", validate_only=True)
    trainer = Trainer(backend=backend, model=model, model_dir=str(tmp_path / "md"),
                      optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1), loop={"num_steps": 5})
    results = trainer.fit(loader())
    assert results["graph"].num_parameters == sum(p.numel() for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not list((tmp_path / "md").glob("checkpoint_*"))


# The Trainer's loop, checkpoint and logging arguments are named as the user wrote them (loop.num_steps),
# never as the runconfig keys they become: (Trainer arguments, fit with a val loader, the message).
TRAINER_REFUSALS = [
    ({"loop": {"num_steps": 2, "num_epochs": 1}}, False,
     "Trainer: loop.num_steps and loop.num_epochs are mutually exclusive; set one of them (loop.max_steps may be "
     "combined with either)"),
    ({"loop": {}}, False, "Trainer: set one of loop.num_steps, loop.num_epochs or loop.max_steps to say how long to run "
                          "(loop.steps_per_epoch only sets the length of an epoch)"),
    ({"loop": {"num_steps": 2, "steps_per_epoch": 9}}, False,
     "Trainer: loop.steps_per_epoch=9 exceeds the 8 batches one pass over the dataloader gives; set it to at most 8"),
    ({"loop": {"num_steps": 2, "grad_accum_steps": 9}}, False,
     "Trainer: loop.grad_accum_steps=9 is greater than the 8 batches per epoch, so no optimizer step is taken; "
     "lower it or enlarge the epoch"),
    ({"loop": {"num_steps": 0}}, False, "Trainer: loop.num_steps: must be >= 1, got 0"),
    ({"loop": {"num_steps": 2, "eval_steps": 0}}, True, "Trainer: loop.eval_steps: must be >= 1, got 0"),
    ({"loop": {"num_steps": 2, "eval_frequency": 1.5}}, True,
     "Trainer: loop.eval_frequency: a float is the fraction of the run's steps between evaluations, in (0, 1]; "
     "got 1.5 (an integer counts steps)"),
    ({"loop": {"num_steps": 2}, "checkpoint": {"steps": -1}}, False, "Trainer: checkpoint.steps: must be >= 0, got -1"),
    ({"loop": {"num_steps": 2}, "logging": {"log_steps": 0}}, False, "Trainer: logging.log_steps: must be >= 1, got 0"),
    ({"loop": {"num_steps": 2, "early_stopping_metric": "eval/loss"}}, False,
     "Trainer: loop.early_stopping_metric needs evaluations during training, which only train_and_eval runs (cs-run "
     "train-and-eval, a Trainer.fit with a val_dataloader), every loop.eval_frequency steps: use that mode and set "
     "the key"),
    ({"loop": {"num_steps": 2, "eval_frequency": 1, "early_stopping_metric": "eval/acc"}}, True,
     "Trainer: loop.early_stopping_metric: 'eval/acc' is not a value the evaluation reports (it reports eval/loss)"),
]


@pytest.mark.parametrize("arguments, val, message", TRAINER_REFUSALS)
def test_trainer_loop_messages_name_the_trainers_arguments(arguments, val, message, tmp_path):
    with pytest.raises(cs_run.errors.ParamsError) as info:
        model = WithLoss()
        trainer = Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=model,
                          optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1), **arguments)
        trainer.fit(loader(), loader(1) if val else None)
    assert str(info.value) == message
    assert not (tmp_path / "md").exists()


def test_a_trainer_run_past_its_max_steps_names_loop_max_steps(tmp_path):
    model = WithLoss()
    trainer = Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=model,
                      optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1), loop={"max_steps": 2})
    trainer.fit(loader())
    with pytest.raises(cs_run.errors.ParamsError) as info:
        trainer.fit(loader())
    assert str(info.value) == ("Trainer: the run starts at global step 2, which already reaches loop.max_steps=2; "
                               "raise loop.max_steps to train further, or start from step 0 (another model_dir, or "
                               "no checkpoint)")


def test_trainer_loop_log_lines_name_the_trainers_arguments(tmp_path, caplog):
    model = WithLoss()
    trainer = Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=model,
                      optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1),
                      loop={"num_steps": 2, "eval_frequency": 1, "eval_steps": 50})
    with caplog.at_level("INFO", logger="cs_run"):
        trainer.fit(loader())  # no val loader: eval_frequency has no effect
        trainer.validate(loader(1))  # 8 batches, eval_steps 50
    text = caplog.text
    assert "loop.eval_frequency=1 has no effect here" in text
    assert "loop.eval_steps=50 but the eval loader has 8 batches: evaluating 8" in text
    assert "runconfig." not in text


def test_an_empty_val_dataloader_is_named_as_the_trainers_argument(tmp_path):
    model = WithLoss()
    trainer = Trainer(device="CPU", model_dir=str(tmp_path / "md"), model=model,
                      optimizer=cs_run.optim.SGD(model.parameters(), lr=0.1), loop={"num_steps": 2})
    empty = DataLoader(TensorDataset(torch.randn(3, 6), torch.randint(0, 3, (3,))), batch_size=4, drop_last=True)
    for call in (lambda: trainer.validate(empty), lambda: trainer.fit(loader(), empty)):
        with pytest.raises(cs_run.errors.ParamsError) as info:
            call()
        assert str(info.value) == ("Trainer: val_dataloader: the eval loader yields no batch; check its batch_size "
                                   "and drop_last")
        assert not (tmp_path / "md").exists()


MISSING = "/no/mnist/here"
NO_MNIST = ("no MNIST {split} data in " + MISSING + " (looked for {prefix}-images-idx3-ubyte[.gz] and "
            "{prefix}-labels-idx1-ubyte[.gz] there and in MNIST/raw); point data_dir at the MNIST folder, or set it "
            "to 'bundled:digits' to train on the bundled digits")
GOOD = {"batch_size": 8, "data_dir": "bundled:digits"}
# The Trainer's dataloader dicts are input sections for the model's data function; what the data function (or its
# signature check) refuses is named as the user wrote it, train_dataloader / val_dataloader, never as the params
# file's train_input / eval_input (cs-run's own text and the fc_mnist data function's alike).
DICT_INPUT_REFUSALS = [
    ("fit", {"batch_size": 8, "data_dir": MISSING}, None,
     "Trainer: train_dataloader.data_dir: " + NO_MNIST.format(split="train", prefix="train")),
    ("fit", GOOD, {"batch_size": 8, "data_dir": MISSING},
     "Trainer: val_dataloader.data_dir: " + NO_MNIST.format(split="eval", prefix="t10k")),
    ("validate", None, {"batch_size": 8, "data_dir": MISSING},
     "Trainer: val_dataloader.data_dir: " + NO_MNIST.format(split="eval", prefix="t10k")),
    ("fit", {**GOOD, "bogus_key": 1}, None,
     "Trainer: unknown key train_dataloader.bogus_key; valid keys: batch_size, data_dir, data_fn, drop_last_batch, "
     "num_workers, persistent_workers, prefetch_factor, shuffle, shuffle_seed, to_float16"),
    ("fit", GOOD, {"batch_sze": 8, "data_dir": "bundled:digits"},
     "Trainer: unknown key val_dataloader.batch_sze; did you mean 'batch_size'?"),
    ("fit", {**GOOD, "data_fn": "os:nothing_here"}, None,
     "Trainer: train_dataloader.data_fn: module 'os' has no attribute 'nothing_here'"),
    ("fit", {**GOOD, "data_fn": "os.path:join"}, None,
     'Trainer: train_dataloader.data_fn: posixpath:join(a, *p) cannot be called as a data function (it does not '
     'take split): it is called with split ("train" or "eval") and the keys of train_dataloader it names, all by '
     'name, and returns a torch.utils.data.DataLoader; expected def join(split)'),
    ("fit", {**GOOD, "batch_size": 0}, None, "Trainer: train_dataloader.batch_size: must be >= 1, got 0"),
    ("fit", GOOD, {**GOOD, "shuffle": "yes"}, "Trainer: val_dataloader.shuffle: expected a boolean (true/false), got str 'yes'"),
]


@pytest.mark.parametrize("verb, train, val, message", DICT_INPUT_REFUSALS)
def test_a_data_function_refusing_a_trainer_dict_input_names_the_trainers_argument(verb, train, val, message,
                                                                                   tmp_path):
    trainer = Trainer(device="CPU", model_dir=str(tmp_path / "md"), model={"name": "fc_mnist", "depth": 1,
                                                                           "hidden_size": 8},
                      optimizer={"optimizer_type": "SGD", "learning_rate": 0.05}, loop={"num_steps": 2})
    with pytest.raises(cs_run.errors.ParamsError) as info:
        trainer.validate(val) if verb == "validate" else trainer.fit(train, val)
    assert str(info.value) == message
    assert not (tmp_path / "md").exists()
