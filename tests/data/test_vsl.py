"""Packed (VSL) shards and finetuning loss masks through the GPT data processors, to the loss.

The VSL rows are written here by the vendor's packing rule (Release_2.10.0
src/cerebras/modelzoo/data_preparation/data_preprocessing/vsl_pretraining_token_generator.py:130-192,
``create_features_auto_lm_vsl``: each document contributes span ``len-1 .. 0`` and positions ``0 .. len-1``,
the last one a token shorter as the inputs drop the final token; padding 0 in both rows) and read back
by ``use_vsl`` as the vendor's processors do (GptHDF5MapDataProcessor.py:148-150 and
HDF5IterableDataset.py:124-131: the five rows ``input_ids, attention_mask, labels, attention_span,
position_ids``). The expected rows are derived independently, from the end-of-sequence tokens of the
packed inputs. A run on such shards trains the same on CSX fx as on CPU.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from cs_run.data.preprocessing.vendor_config import preprocess_config
from cs_run.data.processors import gpt_hdf5
from cs_run.errors import DataError
from cs_run.params import load_params
from cs_run.registry import get_model_spec, resolve_object
from cs_run.runners import PyTorchBaseRunner
from tests.examples.gpt2_helpers import TINY_MODEL, tiny_params, train_losses, weights

EOS, PAD, MSL, VOCAB = 1, 0, 16, 64
GOLDEN = Path(__file__).resolve().parent / "vendor_preprocess"


def _packed(documents: list[list[int]]) -> np.ndarray:
    """One [5, MSL] sample of ``documents`` (each ending in EOS) by the vendor's packing rule."""
    ids, span, pos = [], [], []
    for i, doc in enumerate(documents):
        ids += doc
        n = len(doc) - (1 if i == len(documents) - 1 else 0)
        span += list(range(n - 1, -1, -1))
        pos += list(range(n))
    inputs, labels = ids[:-1], ids[1:]
    pad = MSL - len(inputs)
    return np.stack([np.int32(inputs + [PAD] * pad), np.int32([1] * len(inputs) + [0] * pad),
                     np.int32(labels + [PAD] * pad), np.int32(span + [0] * pad), np.int32(pos + [0] * pad)])


def _from_eos(input_ids: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(attention_span, position_ids) by hand from the EOS tokens of ``input_ids``' first ``length`` tokens: a
    document runs to its EOS (the last one to the last real token); padding is 0."""
    span, pos = np.zeros(MSL, np.int32), np.zeros(MSL, np.int32)
    start = 0
    for t in range(length):
        ends = [e for e in range(t, length) if input_ids[e] == EOS]
        end = ends[0] if ends else length - 1
        span[t], pos[t] = end - t, t - start
        if input_ids[t] == EOS:
            start = t + 1
    return span, pos


def _documents(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    sizes = {0: [4, 6, 5], 1: [9, 8], 2: [3, 3, 3, 3], 3: [7]}[seed % 4]
    return [[int(x) for x in rng.integers(2, VOCAB, size - 1)] + [EOS] for size in sizes]


def _write(folder: Path, samples: list[np.ndarray], name: str = "packed_0.h5") -> Path:
    """The sample layout [n, rows, MSL]; a single 1-D array is written as it is (the corpus layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    with h5py.File(folder / name, "w") as f:
        f.attrs["n_examples"] = len(samples)
        f.create_dataset("data", data=samples[0] if samples[0].ndim == 1 else np.stack(samples), dtype="i4")
    return folder


@pytest.fixture(scope="module")
def vsl_shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vsl")
    _write(root / "train", [_packed(_documents(i)) for i in range(16)])
    _write(root / "val", [_packed(_documents(i)) for i in range(4)])
    return root


@pytest.mark.parametrize("processor", ["GptHDF5DataProcessor", "GptHDF5MapDataProcessor"])
def test_use_vsl_reads_the_spans_and_positions_of_each_document(vsl_shards, processor):
    loader = gpt_hdf5.build_dataloader("eval", data_dir=str(vsl_shards / "train"), data_processor=processor,
                                       batch_size=4, shuffle=False, use_vsl=True, vocab_size=VOCAB)
    seen = 0
    for batch in loader:
        assert set(batch) == {"input_ids", "attention_mask", "labels", "attention_span", "position_ids"}
        for b in range(len(batch["input_ids"])):
            ids = batch["input_ids"][b].numpy()
            length = int(batch["attention_mask"][b].sum())
            span, pos = _from_eos(ids, length)
            np.testing.assert_array_equal(batch["attention_span"][b].numpy(), span)
            np.testing.assert_array_equal(batch["position_ids"][b].numpy(), pos)
            seen += 1
    assert seen == 16
    # without use_vsl the same shards give the three loss rows only
    plain = next(iter(gpt_hdf5.build_dataloader("eval", data_dir=str(vsl_shards / "train"),
                                                data_processor="GptHDF5MapDataProcessor", batch_size=4,
                                                shuffle=False)))
    assert set(plain) == {"input_ids", "attention_mask", "labels"}


def _bad_span(folder: Path) -> None:
    sample = _packed(_documents(1))
    sample[3, 7] = MSL  # a key of the first document (span 1) claims tokens past the sample's end
    _write(folder, [sample] * 4)


def _bad_position(folder: Path) -> None:
    sample = _packed(_documents(1))
    sample[4, 2] = -1
    _write(folder, [sample] * 4)


@pytest.mark.parametrize("processor,write,kwargs,error,regex", [
    ("GptHDF5MapDataProcessor", lambda d: _write(d, [np.arange(40, dtype=np.int32)]), {"max_sequence_length": 8},
     ValueError, r"^use_vsl: the shards are the corpus layout"),
    ("GptHDF5MapDataProcessor", lambda d: _write(d, [_packed(_documents(0))[:3]] * 4), {},
     ValueError, r"^use_vsl: the shards hold 3 rows per sample; packed shards hold 5"),
    ("GptHDF5DataProcessor", lambda d: _write(d, [_packed(_documents(0))[:3]] * 4), {},
     ValueError, r"^data_dir: .*packed_0.h5 'data' is int32\[4, 3, 16\]; expected .* \[n_examples, 5, "
                 r"max_sequence_length\] \(use_vsl reads packed shards"),
    ("GptHDF5DataProcessor", _bad_span, {}, DataError,
     r"^data_dir: .*packed_0.h5: sample 0: attention_span\[7\] is 16; .* in \[0, 8\] here"),
    ("GptHDF5MapDataProcessor", _bad_position, {}, DataError,
     r"^data_dir: .*: sample 0: position_ids\[2\] is -1; positions restart at 0 in each document, in \[0, 16\)"),
    ("GptHDF5MapDataProcessor", lambda d: _write(d, [_packed(_documents(0))] * 4),
     {"data_transforms": [{"name": "add_sink_tokens"}]}, ValueError,
     r"^data_transforms\[0\].name: 'add_sink_tokens' does not run with use_vsl"),
])
def test_bad_vsl_input_is_one_error_naming_it(tmp_path, processor, write, kwargs, error, regex):
    write(tmp_path / "data")
    with pytest.raises(error, match=regex):
        loader = gpt_hdf5.build_dataloader("train", data_dir=str(tmp_path / "data"), data_processor=processor,
                                           batch_size=1, shuffle=False, use_vsl=True, **kwargs)
        next(iter(loader))


@pytest.mark.parametrize("case", ["summarization", "multi_turn_dialogue"])
def test_finetuning_loss_mask_reaches_the_loss(tmp_path, case):
    """``--config`` finetuning output (summarization prompts, chat user turns masked out of the loss) read by
    the processor: the model's loss is the cross entropy over the loss-mask tokens only, by hand."""
    text = (GOLDEN / case / "config.yaml").read_text()
    text = text.replace("<IN>", str(GOLDEN / "inputs")).replace("<OUT>", str(tmp_path / "out"))
    config = tmp_path / f"{case}.yaml"
    config.write_text(text.replace("<TOK>", str(GOLDEN / "tokenizer")))
    preprocess_config(str(config))
    loader = gpt_hdf5.build_dataloader("eval", data_dir=str(tmp_path / "out"), batch_size=2, shuffle=False)
    batch = next(iter(loader))
    mask = batch["attention_mask"]
    assert 0 < int(mask.sum()) < int((batch["input_ids"] != 0).sum())  # the prompt is left out of the loss
    vocab = int(max(batch["input_ids"].max(), batch["labels"].max())) + 1
    torch.manual_seed(0)
    model = _build({**TINY_MODEL, "vocab_size": vocab, "max_position_embeddings": batch["input_ids"].shape[1],
                    "dropout_rate": 0.0})
    with torch.no_grad():
        logits = model.model(batch["input_ids"])
        loss = model(batch)
    by_hand = [F.cross_entropy(logits[b, t], batch["labels"][b, t].long())
               for b in range(len(mask)) for t in range(mask.shape[1]) if mask[b, t]]
    torch.testing.assert_close(loss, torch.stack(by_hand).mean(), rtol=1e-6, atol=1e-6)


def _build(keys: dict):
    keys = dict(keys)
    return resolve_object(get_model_spec(keys.pop("name")).model_fn)(**keys).eval()


def _run(tmp_path: Path, shards: Path, device: str) -> PyTorchBaseRunner:
    path = tiny_params(tmp_path / f"{device}.yaml", shards / "train", shards / "val",
                       model={"position_embedding_type": "rotary", "rotary_dim": 8, "dropout_rate": 0.0},
                       runconfig={"model_dir": str(tmp_path / device), "max_steps": 6, "log_steps": 1,
                                  "compile_tier": "fx"})
    raw = yaml.safe_load(path.read_text())
    for section in ("train_input", "eval_input"):
        raw[section]["use_vsl"] = True
    path.write_text(yaml.safe_dump(raw))
    runner = PyTorchBaseRunner.create(load_params(path), device=device)
    runner.run("train")
    return runner


def test_vsl_run_on_csx_fx_equals_cpu(tmp_path, vsl_shards):
    cpu, csx = _run(tmp_path, vsl_shards, "CPU"), _run(tmp_path, vsl_shards, "CSX")
    assert [s for s, _ in train_losses(cpu)] == list(range(1, 7))
    assert train_losses(csx) == train_losses(cpu)
    expected, got = weights(cpu), weights(csx)
    for key, value in expected.items():
        assert torch.equal(value, got[key]), key
    shutil.rmtree(tmp_path / "CPU")
