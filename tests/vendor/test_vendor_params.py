"""The Model Zoo's own params vocabulary: every key of the vendor's runconfig schemas (Release_1.8 ... 2.10)
and fc_mnist files is accepted with its local meaning or recorded; each release form validates and trains.

The schema table below was written from the vendor's ``runconfig_schema.yaml`` files (key -> JSON types);
the forms are written here from the vendor files' structure (not copied)."""

from __future__ import annotations

import logging

import pytest
import yaml

from cs_run import vendor_params
from cs_run.errors import ParamsError
from cs_run.params import load_params
from cs_run.resolve import resolve_params
from cs_run.runners import PyTorchBaseRunner
from tests.vendor.helpers import write_mnist

# runconfig_schema.yaml, union over Release_1.8.0, 1.9.1, 2.0.2, 2.1.0, 2.2.0, 2.3.0, 2.5.0, 2.7.0, 2.10.0
SCHEMA = {
    "act_memory_gi": "integer", "autogen_policy": "string", "autoload_last_checkpoint": "boolean",
    "cbcore_image": "string", "check_loss_values": "boolean", "checkpoint_path": "string",
    "checkpoint_steps": "integer", "chf_memory_gi": "integer", "cmd_memory_gi": "integer",
    "compile_crd_memory_gi": "integer", "compile_dir": "string", "compile_only": "boolean",
    "credentials_path": "string", "debug_args": "object", "debug_args_path": "string",
    "disable_strict_checkpoint_loading": "boolean", "disable_version_check": "boolean", "dist_addr": "string",
    "dist_backend": "string", "drop_data": "boolean", "dump_activations": "boolean", "enable_act_frequency": "boolean",
    "enable_distributed": "boolean", "enable_summaries": "boolean", "eval_frequency": "integer",
    "eval_steps": "integer", "execute_crd_memory_gi": "integer", "execution_strategy": "string",
    "experimental": "object", "experimental_api": "boolean", "fabric_type_blacklist": "array",
    "hf_cache_dir": "string", "ini": "object", "init_method": "string", "is_pretrained_checkpoint": "boolean",
    "job_labels": "array", "job_priority": "string", "job_time_sec": "integer", "keep_checkpoint_max": "integer",
    "lazy_initialization": "boolean", "legacy_event_dirs": "boolean", "load_checkpoint_states": "string",
    "log_initialization": "boolean", "log_input_summaries": "boolean", "log_steps": "integer", "logging": "string",
    "main_process_id": "integer", "max_checkpoints": "integer", "max_steps": "integer", "mgmt_address": "string",
    "mgmt_namespace": "string", "mode": "string", "model_dir": "string", "mount_dirs": "array",
    "multireplica": "boolean", "num_act_servers": "integer", "num_csx": "integer", "num_epochs": "integer",
    "num_replicas": "integer", "num_steps": "integer", "num_wgt_servers": "integer", "num_workers_per_csx": "integer",
    "op_profiler_config": "object", "precision_opt_level": "integer", "python_paths": "array",
    "retrace_every_iteration": "boolean", "save_initial_checkpoint": "boolean", "save_losses": "boolean",
    "save_stream_size": "integer", "save_summary_steps": "integer", "seed": "integer", "service_dir": "string",
    "show_debug_metrics": "boolean", "skip_train_recv_activations": "boolean", "steps_per_epoch": "integer",
    "summary_dir": "string", "sync_batchnorm": "boolean", "target_device": "string", "transfer_processes": "integer",
    "use_appliance_data": "boolean", "use_cs_grad_accum": "boolean", "use_cstorch_optimizer_step": "boolean",
    "validate_only": "boolean", "variant": "string", "wgt_memory_gi": "integer", "wrk_memory_gi": "integer",
    "wsc_log_level": "object",
}
# A valid value per key (type from the schema; cs-run's own range rules for its native keys).
SAMPLE = {"integer": 2, "string": "x", "boolean": False, "array": [], "object": {}}
SPECIAL = {"logging": "INFO", "model_dir": "md", "compile_dir": "cc", "checkpoint_path": None,
           "python_paths": [], "mount_dirs": [], "job_labels": ["team=ml"], "validate_only": False,
           "compile_only": False, "num_epochs": None, "num_steps": None, "steps_per_epoch": None,
           "mode": "train", "target_device": "CPU", "max_steps": 3}
BASE = {
    "train_input": {"data_dir": "bundled:digits", "batch_size": 8},
    "model": {"name": "fc_mnist", "depth": 1, "hidden_size": 8},
    "optimizer": {"optimizer_type": "SGD", "learning_rate": 0.01},
    "runconfig": {"max_steps": 3},
}


def _load(path, overrides=None):
    """Parse (load_params) and resolve (the model / data functions' keys) as every entry point does."""
    params = load_params(path, overrides)
    resolve_params(params)
    return params


def _write(tmp_path, data, name="params.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False) if isinstance(data, dict) else data)
    return path


def test_every_schema_key_has_a_meaning():
    assert set(SCHEMA) <= set(vendor_params.RUNCONFIG_KEYS)
    for key, (action, _target, types) in vendor_params.RUNCONFIG_KEYS.items():
        assert SCHEMA.get(key, types[0]) in types, key
        assert action in ("native", "mapped", "recorded")


@pytest.mark.parametrize("key", sorted(SCHEMA))
def test_each_schema_key_validates_with_its_meaning(tmp_path, monkeypatch, key):
    monkeypatch.chdir(tmp_path)
    value = SPECIAL.get(key, SAMPLE[SCHEMA[key]])
    data = {k: dict(v) for k, v in BASE.items()}
    data["runconfig"][key] = value
    vendor_params.RECORDED.clear()
    params = _load(_write(tmp_path, data))
    action, target, _ = vendor_params.RUNCONFIG_KEYS[key]
    if action == "recorded":
        assert vendor_params.RECORDED[f"runconfig.{key}"] == value
    elif action == "mapped":
        assert getattr(params.runconfig, target) == value
    elif value is not None and key not in ("model_dir", "compile_dir"):
        assert getattr(params.runconfig, key) == value


@pytest.mark.parametrize("key,value", [("save_losses", "yes"), ("num_wgt_servers", "many"),
                                       ("debug_args", [1]), ("experimental_api", 1)])
def test_recorded_keys_are_type_checked_against_the_schema(tmp_path, key, value):
    data = {k: dict(v) for k, v in BASE.items()}
    data["runconfig"][key] = value
    with pytest.raises(ParamsError, match=rf"runconfig.{key}: expected .*\(vendor schema\), got"):
        load_params(_write(tmp_path, data))


@pytest.mark.parametrize("section,key,hint", [("runconfig", "save_lossez", "save_losses"),
                                              ("runconfig", "log_stpes", "log_steps"),
                                              ("csconfig", "use_cbfloat61", "use_cbfloat16"),
                                              ("train_input", "batch_sise", "batch_size")])
def test_unknown_keys_stay_errors_with_did_you_mean(tmp_path, section, key, hint):
    data = {k: dict(v) for k, v in BASE.items()}
    data.setdefault(section, {})[key] = 1
    with pytest.raises(ParamsError, match=rf"{section}.{key}.*did you mean '{hint}'"):
        _load(_write(tmp_path, data))


def test_mapped_key_and_its_cs_run_name_must_agree(tmp_path):
    data = {k: dict(v) for k, v in BASE.items()}
    data["runconfig"].update(autoload_last_checkpoint=False, autoload_checkpoint=True)
    with pytest.raises(ParamsError, match="same setting with different values"):
        load_params(_write(tmp_path, data))


# ---------------------------------------------------------------------------------- release forms

FORMS = {
    "1.6": """
train_input: {data_dir: "./data/mnist/train", batch_size: 16, drop_last_batch: True, shuffle: True}
eval_input: {data_dir: "./data/mnist/val", batch_size: 16, drop_last_batch: True, shuffle: False}
model: {name: "fc_mnist", mixed_precision: True, depth: 2, hidden_size: 20, dropout: 0.0, activation_fn: "relu"}
optimizer: {optimizer_type: "SGD", learning_rate: 0.01, momentum: 0.5, loss_scaling_factor: 1.0}
runconfig: {max_steps: 4, checkpoint_steps: 2, log_steps: 2, seed: 3, save_losses: True}
""",
    "1.8": """
train_input: {data_dir: "./data/mnist/train", batch_size: 16, drop_last_batch: True, shuffle: True}
eval_input: {data_dir: "./data/mnist/val", batch_size: 16, drop_last_batch: True, shuffle: False}
model: {name: "fc_mnist", mixed_precision: False, depth: 2, hidden_size: 20, dropout: 0.1, activation_fn: "relu"}
optimizer: {optimizer_type: "SGD", learning_rate: 0.01, momentum: 0.5, loss_scaling_factor: 1.0}
runconfig: {max_steps: 4, checkpoint_steps: 2, log_steps: 2, seed: 3, save_losses: False,
            keep_checkpoint_max: 2, experimental_api: True}
""",
    "1.9/2.0 csconfig": """
train_input: {data_dir: "./mnist", batch_size: 8, drop_last_batch: True, to_float16: True, shuffle: True}
eval_input: {data_dir: "./mnist", batch_size: 8, drop_last_batch: True, shuffle: False}
model: {name: "fc_mnist", mixed_precision: True, depth: 3, hidden_size: 10, dropout: 0.0, activation_fn: "relu",
        to_float16: False}
optimizer: {optimizer_type: "SGD", learning_rate: 0.01, momentum: 0.0, loss_scaling_factor: 1.0}
runconfig: {num_epochs: 1, steps_per_epoch: 4, max_steps: 100, log_steps: 2, checkpoint_steps: 1000, seed: 2,
            model_dir: "./model_dir", show_debug_metrics: False, save_losses: True}
csconfig: {use_cbfloat16: False}
""",
    "2.1-2.9": """
train_input: {data_processor: "MNISTDataProcessor", data_dir: "./mnist", batch_size: 8, drop_last_batch: True,
              to_float16: True, shuffle: True, split: "train"}
eval_input: {data_processor: "MNISTDataProcessor", data_dir: "./mnist", batch_size: 8, drop_last_batch: True,
             shuffle: False, split: "val"}
model: {name: "fc_mnist", mixed_precision: True, depth: 3, hidden_size: 10, dropout: 0.0, activation_fn: "relu",
        to_float16: False}
optimizer: {optimizer_type: "SGD", learning_rate: 0.01, momentum: 0.0, loss_scaling_factor: 1.0}
runconfig: {max_steps: 4, log_steps: 2, checkpoint_steps: 1000, seed: 2, model_dir: "./model_dir",
            eval_frequency: 1000}
""",
    "2.5+ trainer": """
trainer:
  init:
    model_dir: ./model_dir
    seed: 2
    model: {name: fc_mnist, depth: 3, hidden_size: 10, dropout: 0.0, activation_fn: relu, to_float16: false}
    optimizer:
      SGD: {learning_rate: 0.01, momentum: 0.0}
    precision: {enabled: true, loss_scaling_factor: 1.0}
    loop: {max_steps: 4, eval_frequency: 1000}
    checkpoint: {steps: 1000}
    logging: {log_steps: 2}
    schedulers:
    - ConstantLR: {learning_rate: 0.01}
  fit:
    train_dataloader: {data_processor: MNISTDataProcessor, data_dir: ./mnist, batch_size: 8, drop_last_batch: true,
                       to_float16: true, shuffle: true, split: train}
    val_dataloader: &val {data_processor: MNISTDataProcessor, data_dir: ./mnist, batch_size: 8,
                          drop_last_batch: true, shuffle: false, split: val}
  validate: {val_dataloader: *val}
  validate_all: {val_dataloaders: *val}
""",
}


@pytest.fixture
def vendor_dir(tmp_path, monkeypatch):
    """A working folder laid out as the vendor's fc_mnist expects (./mnist, ./data/mnist/{train,val})."""
    write_mnist(tmp_path / "mnist")
    write_mnist(tmp_path / "data" / "mnist" / "train")
    write_mnist(tmp_path / "data" / "mnist" / "val")
    (tmp_path / "configs").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("device", ["CPU", "CSX"])
def test_each_release_form_validates_and_trains(vendor_dir, form, device, caplog):
    from cs_run.backend import _reset_for_tests

    path = _write(vendor_dir / "configs", FORMS[form])
    assert vendor_params.detect_form(yaml.safe_load(path.read_text())) in (form, "1.6-1.8")
    params = _load(path, {"runconfig.model_dir": str(vendor_dir / f"md_{device}")})
    with _reset_for_tests(), caplog.at_level(logging.INFO, logger="cs_run"):
        PyTorchBaseRunner.create(params, device=device).run("train")
    assert "MNIST IDX files" in caplog.text  # the data at the vendor's (working-directory) path was used
    assert (vendor_dir / f"md_{device}" / "checkpoint_4.mdl").is_file()


def test_a_configured_data_dir_without_data_is_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    data = {k: dict(v) for k, v in BASE.items()}
    data["train_input"]["data_dir"] = "./empty"
    params = _load(_write(tmp_path, data))
    with pytest.raises(ParamsError, match=r"train_input.data_dir: no MNIST train data in .*empty.*bundled:digits"):
        PyTorchBaseRunner.create(params, device="CPU").run("train")


def test_trainer_form_maps_every_section(tmp_path):
    params = load_params(_write(tmp_path, FORMS["2.5+ trainer"]))
    assert params.model.mixed_precision is True and params.model.extra["to_float16"] is False
    assert params.optimizer.optimizer_type == "SGD" and params.optimizer.learning_rate == 0.01
    assert params.optimizer.extra == {"momentum": 0.0} and params.optimizer.loss_scaling_factor == 1.0
    assert (params.runconfig.max_steps, params.runconfig.log_steps, params.runconfig.checkpoint_steps,
            params.runconfig.seed, params.runconfig.eval_frequency) == (4, 2, 1000, 2, 1000)
    assert params.train_input.batch_size == 8 and params.train_input.shuffle is True
    assert params.eval_input.shuffle is False and params.eval_input.batch_size == 8


@pytest.mark.parametrize("text,regex", [
    ("trainer:\n  init: {loop: {max_stepz: 3}}\n", r"trainer.init.loop.max_stepz.*did you mean 'max_steps'"),
    ("trainer:\n  fitt: {}\n", r"trainer.fitt.*did you mean 'fit'"),
    ("trainer:\n  init: {optimizer: {SGD: {}, Adam: {}}}\n", r"trainer.init.optimizer: expected one mapping"),
    ("trainer: {init: {}}\nrunconfig: {}\n", r"the trainer form has only the 'trainer' section"),
    ("trainer:\n- init: {}\n", r"a list of trainers is not supported"),
])
def test_trainer_form_errors_name_the_key(tmp_path, text, regex):
    with pytest.raises(ParamsError, match=regex):
        load_params(_write(tmp_path, text))


def test_cbfloat16_from_csconfig_sets_the_half_type(tmp_path):
    data = {k: dict(v) for k, v in BASE.items()}
    data["model"]["mixed_precision"] = True
    data["csconfig"] = {"use_cbfloat16": True}
    assert load_params(_write(tmp_path, data)).model.fp16_type == "cbfloat16"


@pytest.mark.parametrize("labels, error", [
    ({"description": "DiT-S with patch size 2*2", "tag": "dit_s_2"}, None),  # the 2.0/2.1 dit files' labels
    ({"description": {"not": "text"}}, "unknown key description"),  # a section by that name: still unknown
    ({"descripton": "typo"}, "unknown key descripton"),
])
def test_a_files_text_labels_are_recorded_and_other_top_level_keys_stay_errors(tmp_path, labels, error):
    data = {**{k: dict(v) for k, v in BASE.items()}, **labels}
    if error is None:
        assert load_params(_write(tmp_path, data)).model is not None
    else:
        with pytest.raises(ParamsError, match=error):
            load_params(_write(tmp_path, data))
