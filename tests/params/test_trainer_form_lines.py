"""Errors on trainer-form params files (Model Zoo 2.5+ ``trainer: {init, fit}``) start ``params:``, name
their key and the file's line, as the flat layout's errors do. Each case is a small file of our own with
one bad value; the expected line is the line of the key named by ``# <- here``."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cs_run.errors import ParamsError
from cs_run.params import load_params
from cs_run.resolve import resolve_params

BASE = """\
trainer:
  init:
    model_dir: {model_dir}
    model:
      name: gpt2
      vocab_size: 64
      hidden_size: 16
      num_hidden_layers: 1
      num_heads: 2
      filter_size: 32
      max_position_embeddings: 8
      dropout_rate: 0.0
      attention_type: scaled_dot_product
    optimizer:
      AdamW:
        betas: [0.9, 0.95]
        weight_decay: 0.1
    schedulers:
    - SequentialLR:
        schedulers:
        - LinearLR:
            initial_learning_rate: 0.0
            end_learning_rate: 0.001
            total_iters: 2
        - LinearLR:
            initial_learning_rate: 0.001
            end_learning_rate: 0.0
            total_iters: 3
    precision:
      enabled: false
      max_gradient_norm: 1.0
    loop:
      max_steps: 5
    checkpoint:
      steps: 5
    logging:
      log_steps: 1
  fit:
    train_dataloader:
      data_processor: GptHDF5MapDataProcessor
      data_dir: [{data}]
      batch_size: 2
      shuffle: false
"""

CASES = [
    # (what to replace, with what, the error's start)
    ("      max_steps: 5", "      max_steps: -1  # <- here", r"params: runconfig.max_steps: must be >= 1"),
    ("      batch_size: 2", "      batch_size: two  # <- here", r"params: train_input.batch_size: expected an integer"),
    ("      log_steps: 1", "      log_steps: 0  # <- here", r"params: runconfig.log_steps: must be >= 1"),
    ("      data_dir: [{data}]", "      data_dir: [3]  # <- here", r"params: train_input.data_dir: expected a string or "),
    ("        weight_decay: 0.1", "        weight_decay: 0.1\n        betaz: 2  # <- here",
     r"params: optimizer.betaz: unknown key for AdamW"),
    ("        weight_decay: 0.1", "        weight_decay: 0.1\n        adjust_learning_rate: 0.5  # <- here",
     r"params: optimizer.adjust_learning_rate: expected a mapping"),
    ("        - LinearLR:\n            initial_learning_rate: 0.0\n            end_learning_rate: 0.001\n"
     "            total_iters: 2",
     "        - LinearLR:  # <- here (the entry: its total_iters is missing)\n            initial_learning_rate: 0.0\n"
     "            end_learning_rate: 0.001",
     r"params: optimizer.learning_rate.SequentialLR.schedulers\[0\].LinearLR.total_iters: missing"),
    ("            end_learning_rate: 0.001", "            end_lr: 0.002\n            end_learning_rate: 0.001  # <- here",
     r"params: optimizer.learning_rate.SequentialLR.schedulers\[0\].LinearLR.end_learning_rate: 'end_learning_rate' "
     r"is given twice with different values"),
    ("      hidden_size: 16", "      hidden_sise: 16  # <- here", r"params: unknown key model.hidden_sise"),
    ("      max_gradient_norm: 1.0", "      max_gradient_norm: -1.0  # <- here",
     r"params: optimizer.max_gradient_norm: must be > 0"),
    ("      log_steps: 1", "      log_steps: 1\n    callbacks:\n    - ComputeNorm: {}\n    - Fooo: {}  # <- here",
     r"params: unknown callback trainer.init.callbacks\[1\].Fooo; valid keys: "),
    ("      log_steps: 1", "      log_steps: 1\n    callbacks:\n    - ScopedTrainFlags:\n"
                           "        csx.other.micro_batch_size: 2  # <- here",
     r"params: trainer.init.callbacks\[0\].ScopedTrainFlags.csx.other.micro_batch_size: unknown flag"),
    ("      log_steps: 1", "      log_steps: 1\n    callbacks:\n    - KeepNCheckpoints:\n        m: 2  # <- here",
     r"params: unknown key trainer.init.callbacks\[0\].KeepNCheckpoints.m; valid keys: n"),
    ("      log_steps: 1", "      log_steps: 1\n    callbacks:\n    - KeepNCheckpoints:\n        n: 0  # <- here",
     r"params: runconfig.max_checkpoints: must be >= 1"),
    ("      steps: 5", "      steps: 5\n      checkpoint_name: ckpt_{step}.mdl  # <- here",
     r"params: trainer.init.checkpoint.checkpoint_name: 'ckpt_\{step\}.mdl': cs-run names checkpoints "
     r"checkpoint_\{step\}.mdl"),
    ("      max_steps: 5", "      max_steps: 5\n    backend:\n      csx.other.flag: 1  # <- here",
     r"params: unknown key trainer.init.backend.csx.other.flag"),
    # the Model Zoo's gpt3 sparsity files' section (cs_run.sparsity_params checks it)
    ("      log_steps: 1", "      log_steps: 1\n    sparsity:\n      algorithm: rigl\n      sparsity: 0.75\n"
                           "      update:\n        freq: 0  # <- here",
     r"params: sparsity.update.freq: expected an integer >= 1, got 0"),
    ("      log_steps: 1", "      log_steps: 1\n    sparsity:\n      sparsity: 0.75\n      drop_fraction: 0.3  # <- here",
     r"params: unknown key sparsity.drop_fraction; valid keys: add_summaries, algorithm, init_method, param_filter, sparsity "
     r"\(algorithm static\)"),
]


@pytest.mark.parametrize("old,new,regex", CASES, ids=[c[2].split(":")[1].strip() for c in CASES])
def test_trainer_form_errors_name_file_and_line(tmp_path, old, new, regex):
    data = tmp_path / "shards"
    data.mkdir()
    import h5py  # noqa: PLC0415 - the shards of the data function's check

    with h5py.File(data / "0.h5", "w") as f:
        f.create_dataset("data", data=np.arange(64, dtype=np.int32))
    text = BASE.replace("{model_dir}", str(tmp_path / "model_dir")).replace("{data}", str(data))
    assert old.replace("{data}", str(data)) in text
    text = text.replace(old.replace("{data}", str(data)), new)
    path = tmp_path / "params.yaml"
    path.write_text(text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "# <- here" in row)
    with pytest.raises(ParamsError) as caught:
        resolve_params(load_params(path))
    message = str(caught.value)
    assert re.match(regex, message), message
    assert message.endswith(f"({path}:{line})"), message


def test_the_good_file_resolves(tmp_path):
    text = BASE.replace("{model_dir}", str(tmp_path / "m")).replace("{data}", str(tmp_path)).replace(
        "      log_steps: 1", "      log_steps: 1\n    callbacks:\n    - GlobalFlags:\n        csx.debug.execute_crd_memory_gi: 50\n"
        "    - ScopedTrainFlags:\n        csx.performance.micro_batch_size: 2\n    - ComputeNorm: {}\n"
        "    - LoadCheckpointStates:\n        load_checkpoint_states: model\n    - KeepNCheckpoints:\n        n: 2").replace(
        "      steps: 5", "      steps: 5\n      checkpoint_name: checkpoint_{step}.mdl").replace(
        "      max_steps: 5", "      max_steps: 5\n    backend:\n      backend_type: CSX\n"
        "      csx.debug.implicit_cast_cb16_to_fp32: True")
    path = tmp_path / "params.yaml"
    path.write_text(text)
    params = load_params(path)
    resolve_params(params)
    assert params.optimizer.learning_rate["SequentialLR"]["schedulers"][1]["LinearLR"]["total_iters"] == 3
    assert params.train_input.data_dir == [str(tmp_path)]
    assert params.runconfig.load_checkpoint_states == "model"
    assert params.runconfig.max_checkpoints == 2  # KeepNCheckpoints: the vendor's runconfig.max_checkpoints
    noted = " ".join(message for _, message in params.notes)
    assert "trainer.init.backend.csx.debug.implicit_cast_cb16_to_fp32 = True" in noted  # ViT's dotted backend key
    assert "trainer.init.checkpoint.checkpoint_name = 'checkpoint_{step}.mdl'" in noted
    assert "trainer.init.callbacks[1].ScopedTrainFlags.csx.performance.micro_batch_size = 2" in noted
    assert "the whole batch runs at once here" in noted and "ComputeNorm" in noted
