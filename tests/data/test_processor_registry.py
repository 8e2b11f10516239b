"""The data processor registry: a model names the Model Zoo data processors its inputs read, the data home
registers a function under each name, and an input's ``data_processor`` picks the function by that name."""

from __future__ import annotations

import pytest
import yaml

from cs_run import registry
from cs_run.data.processors import gpt_hdf5, mnist
from cs_run.errors import ParamsError
from cs_run.params import load_params
from cs_run.resolve import data_function


def _params(tmp_path, model: dict, **inputs):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"model": model, **inputs, "optimizer": {"optimizer_type": "SGD",
                                                                             "learning_rate": 0.1}}))
    return load_params(path)


def test_every_processor_a_model_names_is_registered_and_under_the_model_zoo_class_name():
    names = set(registry.registered_data_processors())
    assert {"GptHDF5DataProcessor", "GptHDF5MapDataProcessor", "MNISTDataProcessor"} <= names  # the vendor's names
    for model in registry.registered_models():
        spec = registry.get_model_spec(model)
        named = set(spec.data_processors) | ({spec.data_fn} if spec.data_fn and ":" not in spec.data_fn else set())
        assert named and named <= names, model


def test_an_input_reads_the_function_of_the_processor_it_names(tmp_path, monkeypatch):
    def map_data(split, batch_size):  # stands in for GptHDF5MapDataProcessor's function: the lookup is by name
        raise AssertionError("not called")

    registry.registered_data_processors()  # the data home is imported before its entry is replaced
    monkeypatch.setitem(registry._DATA, "GptHDF5MapDataProcessor", map_data)
    params = _params(tmp_path, {"name": "gpt2", "vocab_size": 64},
                     train_input={"data_dir": "d", "data_processor": "GptHDF5MapDataProcessor"},
                     eval_input={"data_dir": "d"})
    assert data_function(params, "train_input") is map_data
    assert data_function(params, "eval_input") is gpt_hdf5.build_dataloader  # no data_processor: the first named
    params = _params(tmp_path, {"name": "fc_mnist", "depth": 1, "hidden_size": 8},
                     train_input={"data_processor": "MNISTDataProcessor"})
    assert data_function(params, "train_input") is mnist.build_dataloader


def _twice():
    registry.register_data_processor("GptHDF5DataProcessor")(lambda split: None)


def _unknown():
    registry.data_processor_function("NoSuchCSVDataProcessor", "params: train_input.data_processor")


@pytest.mark.parametrize("call,error,message", [
    (_twice, ValueError, r"data processor 'GptHDF5DataProcessor' is registered twice: "
                         r"cs_run.data.processors.gpt_hdf5 and \S*test_processor_registry"),
    (_unknown, ParamsError, r"^params: train_input.data_processor: no data processor 'NoSuchCSVDataProcessor' is "
                            r"registered; registered: (\w+, )*GptHDF5DataProcessor, GptHDF5MapDataProcessor, (\w+, )*MNISTDataProcessor"),
])
def test_registry_refusals(call, error, message, monkeypatch):
    registry.registered_data_processors()
    monkeypatch.setattr(registry, "_DATA", dict(registry._DATA))  # a refused registration leaves no trace
    with pytest.raises(error, match=message):
        call()
