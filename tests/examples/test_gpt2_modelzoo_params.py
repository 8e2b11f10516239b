"""A Model Zoo GPT-2 params file (every key of Release 1.9's params_gpt2_small.yaml; only data_dir and
sizes changed) validates and trains with cs-run. The file below is written from the vendor's key set,
not copied."""

from __future__ import annotations

import math

import torch
from gpt2_helpers import random_samples, write_vendor_shards

from cs_run.params import load_params
from cs_run.runners import PyTorchBaseRunner

MODELZOO_GPT2 = """
train_input:
    data_processor: "GptHDF5DataProcessor"
    data_dir: "{train}"
    batch_size: 8
    shuffle: True
    shuffle_seed: 256
    num_workers: 2
    prefetch_factor: 2
    persistent_workers: True

eval_input:
    data_processor: "GptHDF5DataProcessor"
    data_dir: "{val}"
    batch_size: 8
    shuffle: False
    num_workers: 0

model:
    hidden_size: 32
    vocab_size: 64
    use_position_embedding: True
    position_embedding_type: "learned"
    share_embedding_weights: True
    max_position_embeddings: 16
    num_hidden_layers: 2
    dropout_rate: 0.1
    layer_norm_epsilon: 1.0e-5
    loss_scaling: "batch_size"
    loss_weight: 0.0625
    num_heads: 4
    attention_type: "scaled_dot_product"
    attention_dropout_rate: 0.1
    use_projection_bias_in_attention: True
    use_ffn_bias_in_attention: True
    filter_size: 128
    nonlinearity: "gelu"
    use_ffn_bias: True
    use_bias_in_output: False
    mixed_precision: True

optimizer:
    optimizer_type: "adamw"
    beta1: 0.9
    beta2: 0.95
    epsilon: 1.0e-8
    max_gradient_norm: 1.0
    learning_rate:
      - scheduler: "Linear"
        initial_learning_rate: 0.0
        end_learning_rate: 0.003
        steps: 4
      - scheduler: "Linear"
        initial_learning_rate: 0.003
        end_learning_rate: 0.0
        alpha: 0.1
        steps: 12
    weight_decay_rate: 0.01
    use_bias_correction: True
    initial_loss_scale: 2147483648.0
    max_loss_scale: 2147483648.0

runconfig:
    max_steps: 16
    log_steps: 4
    checkpoint_steps: 8
    save_initial_checkpoint: True
    seed: 1
    model_dir: "{model_dir}"
    show_debug_metrics: False
    save_losses: True
    eval_steps: 2
"""


def test_model_zoo_gpt2_small_keys_validate_and_train(tmp_path):
    write_vendor_shards(tmp_path / "train", random_samples(96, 16, 64), per_file=32)
    write_vendor_shards(tmp_path / "val", random_samples(16, 16, 64, seed=1), per_file=16)
    path = tmp_path / "params_gpt2_small.yaml"
    path.write_text(MODELZOO_GPT2.format(train=tmp_path / "train", val=tmp_path / "val", model_dir=tmp_path / "md"))
    params = load_params(path)
    assert params.model.name == "gpt2"  # named by its data_processor, as the Model Zoo's gpt2/run.py implies
    runner = PyTorchBaseRunner.create(params, device="CPU")
    group = runner.optimizer.param_groups[0]
    assert type(runner.optimizer).__name__ == "AdamW"
    assert tuple(group["betas"]) == (0.9, 0.95) and group["eps"] == 1e-8 and group["weight_decay"] == 0.01
    assert runner.model.loss_scaling == "batch_size" and runner.model.loss_weight == 0.0625
    initial = runner.run("train_and_eval")
    assert runner.global_step == 16 and math.isfinite(initial["eval/loss"])
    assert set(initial) >= {"eval/lm_perplexity", "eval/accuracy"}
    assert torch.isfinite(torch.tensor(initial["eval/lm_perplexity"]))


def test_a_params_files_map_data_processor_reads_its_mixture_and_subset(tmp_path, caplog):
    """data_processor: GptHDF5MapDataProcessor in a params file (Release 2.2's jais_30b_phase1 trains on a
    mixture with it) is passed to the GPT data function, which then reads mixture and data_subset; an
    fc_mnist file's data_processor stays a recorded vendor class name (tests/vendor)."""
    write_vendor_shards(tmp_path / "a", random_samples(40, 16, 64), per_file=20)
    write_vendor_shards(tmp_path / "b", random_samples(40, 16, 64, seed=2), per_file=20)
    write_vendor_shards(tmp_path / "val", random_samples(16, 16, 64, seed=1), per_file=16)
    text = MODELZOO_GPT2.format(train="unused", val=tmp_path / "val", model_dir=tmp_path / "md")
    mixture = (f'    mixture:\n      - data_dir: "{tmp_path / "a"}"\n        weight: 0.75\n'
               f'      - data_dir: "{tmp_path / "b"}"\n        weight: 0.25\n        data_subset: "0.0-0.5"\n')
    text = text.replace('    data_processor: "GptHDF5DataProcessor"\n    data_dir: "unused"\n',
                        '    data_processor: "GptHDF5MapDataProcessor"\n' + mixture, 1)
    path = tmp_path / "params.yaml"
    path.write_text(text.replace("max_steps: 16", "max_steps: 4"))
    params = load_params(path)
    assert params.to_dict()["train_input"]["data_processor"] == "GptHDF5MapDataProcessor"
    assert params.to_dict()["eval_input"]["data_processor"] == "GptHDF5DataProcessor"
    with caplog.at_level("INFO", logger="cs_run"):
        PyTorchBaseRunner.create(params, device="CPU").run("train")
    # The Model Zoo's epoch of a mixture shows every sample of each reader: max(40 / 0.75, 20 / 0.25) = 80, the
    # 20 being b's first half (data_subset); without the subset it would be 160.
    assert "GPT data (train, GptHDF5MapDataProcessor): 80 samples of 16 tokens in 4 shard(s) of a mixture" in caplog.text
    assert "GPT data (eval" not in caplog.text  # train only
