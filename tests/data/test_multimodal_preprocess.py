"""``cs-run data preprocess --config`` of the Model Zoo's llava configs (dataset.is_multimodal), past the recorded
vendor cases of test_vendor_preprocess.py: the written samples feed LlavaHDF5MapDataProcessor (rows and images as
written) and a shrunk Model Zoo llava file trains on them; each bad config or record is one line."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from cs_run._yaml import parse as parse_yaml
from cs_run.data.preprocessing.vendor_config import preprocess_config
from cs_run.data.processors.llava_hdf5 import build_dataloader
from cs_run.errors import DataError, ParamsError
from cs_run.summaries import read_scalars

Image = pytest.importorskip("PIL.Image")
ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "vendor_preprocess"
TOOL = ROOT / "tools" / "modelzoo_files.py"
_spec = importlib.util.spec_from_file_location("modelzoo_files", TOOL)
mz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mz)


def _config(case_id: str, tmp_path: Path, out: Path, inputs: Path = GOLDEN / "inputs", edit=None) -> Path:
    text = (GOLDEN / case_id / "config.yaml").read_text()
    if edit is not None:
        text = edit(text)
    text = text.replace("<IN>", str(inputs)).replace("<OUT>", str(out)).replace("<TOK>", str(GOLDEN / "tokenizer"))
    path = tmp_path / f"{case_id}.yaml"
    path.write_text(text)
    return path


def _loader(out: Path, images: Path, **change):
    keys = dict(data_dir=str(out), img_data_dir=str(images), batch_size=4, shuffle=False,
                transforms=[{"name": "to_tensor"}], max_sequence_length=64,
                image_model={"image_size": [28, 28], "num_channels": 3}, text_model={"vocab_size": 512})
    return build_dataloader("train", **{**keys, **change})


def test_written_samples_read_back_through_llava_data(tmp_path):
    """The loader's four rows are the .h5 file's first four, and each image is the PNG its img_path names
    (a black one where the record had none)."""
    out = tmp_path / "out"
    preprocess_config(str(_config("llava_phase_2", tmp_path, out)))
    images = GOLDEN / "inputs" / "llava" / "images"
    batch = next(iter(_loader(out, images)))
    with h5py.File(out / "output_chunk_0.h5", "r") as f:
        data, paths = f["data"][()], [p[0] for p in f["img_path"][()]]
    assert data.shape == (4, 5, 64)
    for i, name in enumerate(("text_input_ids", "loss_mask", "labels", "key_padding_mask")):
        np.testing.assert_array_equal(batch[name].numpy(), data[:, i])
    for i, path in enumerate(paths):
        if path == b"None":
            want = np.zeros((28, 28, 3), np.uint8)
        else:
            want = np.asarray(Image.open(images / path.decode()).convert("RGB"))
        np.testing.assert_array_equal((batch["image_data"][i].permute(1, 2, 0).numpy() * 255).round(), want)


@pytest.mark.slow
def test_written_samples_train_a_model_zoo_llava_file_3_steps(tmp_path):
    """The phase-1 7b file (its image at position 1, where the llava configs' chat template puts it), shrunk by
    tools/modelzoo_files.py, trains 3 CPU steps on the llava_phase_2 config's output, written by the tool's
    --llava-config writer (cs-run data preprocess --config, the images copied)."""
    if not Path(mz.MIRROR).exists():
        pytest.skip("no local Model Zoo mirror")
    start = tmp_path / "shards" / "llava" / "start_1"
    config = _config("llava_phase_2", tmp_path, tmp_path / "unused")
    mz.write_llava_from_config(start, str(config), str(Path(sys.executable).with_name("cs-run")))
    with h5py.File(start / "train" / "output_chunk_0.h5", "r") as f, \
            h5py.File(GOLDEN / "llava_phase_2" / "output_chunk_0.h5", "r") as want:
        np.testing.assert_array_equal(f["data"][()], want["data"][()])
    assert sorted(p.name for p in (start / "images").iterdir()) == ["blue.png", "green.png", "red.png"]
    text = subprocess.run(["git", f"--git-dir={mz.MIRROR}", "show", "Release_2.10.0:src/cerebras/modelzoo/models/"
                           "multimodal/llava/configs/params_llava_v1p5_pretrain_7b_phase1_MSL2K.yaml"], check=True,
                          capture_output=True, text=True).stdout
    params = mz.shrink(parse_yaml(text, "llava")[0], tmp_path / "shards", tmp_path / "model_dir")
    assert params["trainer"]["init"]["model"]["image_start_idx"] == 1
    init = params["trainer"]["init"]
    init["loop"]["max_steps"], init["logging"]["log_steps"] = 3, 1
    for key in ("eval_frequency", "eval_steps"):
        init["loop"].pop(key, None)
    params["trainer"].pop("validate", None), params["trainer"]["fit"].pop("val_dataloader", None)
    params["trainer"]["fit"]["train_dataloader"]["num_workers"] = 0
    assert params["trainer"]["fit"]["train_dataloader"]["data_dir"] == str(start / "train")
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    from click.testing import CliRunner  # noqa: PLC0415

    from cs_run.frontends.cli import cli  # noqa: PLC0415

    result = CliRunner().invoke(cli, ["train", "--params", str(path), "--model_dir", str(tmp_path / "m"),
                                      "--device", "CPU"])
    assert result.exit_code == 0, result.output
    losses = read_scalars(tmp_path / "m" / "train")["loss"]
    assert [s for s, _ in losses] == [1, 2, 3] and all(np.isfinite(v) for _, v in losses)


def _record(line: str):
    def write(inputs: Path) -> None:
        (inputs / "llava" / "records.jsonl").write_text(line + "\n")
    return write


# (id, recorded case, config edit, input edit, error kind, what the one line says)
BAD = [
    ("image-dir-missing", "llava_phase_2", lambda t: t.replace("image_dir: <IN>", "image_dir: /no/such"), None,
     ParamsError, r"setup\.image_dir is '/no/such/llava/images', not a folder \(.*yaml:\d+\); give the folder"),
    ("image-dir-absent", "llava_phase_2", lambda t: t.replace("  image_dir: <IN>/llava/images\n", ""), None,
     ParamsError, r"setup\.image_dir is None, not a folder \(.*yaml"),
    ("unknown-key", "llava_phase_2", lambda t: t.replace("  num_patches: 4", "  num_patches: 4\n  num_patch: 4"), None,
     ParamsError, r"dataset\.num_patch is not a key the Model Zoo's preprocessing reads \(.*yaml:\d+\); remove it"),
    ("num-patches-zero", "llava_phase_2", lambda t: t.replace("  num_patches: 4", "  num_patches: 0"), None,
     ParamsError, r"dataset\.num_patches is 0 \(.*yaml:\d+\); give a positive integer"),
    ("image-in-pretraining", "llava_phase_2", lambda t: t.replace("mode: finetuning", "mode: pretraining"), None,
     ParamsError, r"setup\.mode is 'pretraining' with multimodal data \(image captions\) \(.*yaml:\d+\)"),
    ("not-multimodal", "llava_phase_2", lambda t: t.replace("is_multimodal: true", "is_multimodal: false"), None,
     ParamsError, r"setup\.image_dir asks for images but dataset\.is_multimodal is not true \(.*yaml:\d+\)"),
    ("image-path-a-number", "llava_phase_2", None,
     _record('{"image": ["red.png"], "conversations": [{"from": "human", "value": "<image> hi"}, {"from": "gpt", "value": "yo"}]}'),
     DataError, r"records\.jsonl:1 has a list where finetuning_llava_hook reads an image path; give a string"),
    ("two-images-in-a-turn", "llava_phase_2", None,
     _record('{"image": "red.png", "conversations": [{"from": "human", "value": "<image> and <image>"}, '
             '{"from": "gpt", "value": "two"}]}'),
     DataError, r"records\.jsonl:1 has 2 image tokens '<image>' in one user turn; .*fix the record"),
    ("image-token-in-answer", "llava_phase_2", None,
     _record('{"image": "red.png", "conversations": [{"from": "human", "value": "<image> what?"}, '
             '{"from": "gpt", "value": "an <image>"}]}'),
     DataError, r"records\.jsonl:1 has the image token '<image>' in an assistant turn"),
    ("unknown-role", "llava_phase_2", None,
     _record('{"image": "red.png", "conversations": [{"from": "bot", "value": "<image> what?"}]}'),
     DataError, r"records\.jsonl:1 has a turn whose 'from' is 'bot'"),
    ("phase-1-without-image", "llava_phase_1", None,
     lambda inputs: (inputs / "llava_pretrain" / "records.jsonl").write_text(
         '{"conversations": [{"from": "human", "value": "<image> hi"}, {"from": "gpt", "value": "yo"}]}\n'),
     DataError, r"records\.jsonl:1 has no 'image' \(finetuning_llava_hook_prompt_completion needs an image"),
]


@pytest.mark.parametrize("case_id, edit, inputs_edit, kind, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_multimodal_config_or_record_is_one_line(case_id, edit, inputs_edit, kind, message, tmp_path):
    inputs = tmp_path / "inputs"
    for folder in ("llava", "llava_pretrain"):
        shutil.copytree(GOLDEN / "inputs" / folder, inputs / folder)
    if inputs_edit is not None:
        inputs_edit(inputs)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("earlier work")
    config = _config(case_id, tmp_path, out, inputs, edit)
    with pytest.raises(kind, match=message) as info:
        preprocess_config(str(config))
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]  # nothing written, nothing lost


def test_missing_image_skips_the_record_as_the_vendor(tmp_path):
    """A record naming an image that is not there is left out and counted (raw_docs_skipped), as the vendor's
    tool does (the recorded cases hold one such record); the run goes on."""
    import json  # noqa: PLC0415

    out = tmp_path / "out"
    summary = preprocess_config(str(_config("llava_phase_2", tmp_path, out)))
    params = json.loads((out / "data_params.json").read_text())
    assert params["post-process"]["raw_docs_skipped"] == 1 and summary.n_examples == 4
    with h5py.File(out / "output_chunk_0.h5", "r") as f:
        assert b"missing.png" not in [p[0] for p in f["img_path"][()]]
