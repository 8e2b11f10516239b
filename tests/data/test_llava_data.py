"""LlavaHDF5MapDataProcessor: the samples of the vendor's llava preprocessing layout read back (rows and
images by hand, expand_to_square's padding among them), and each bad input one error naming what and where."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from cs_run.data.processors.llava_hdf5 import build_dataloader
from cs_run.errors import CsRunError

Image = pytest.importorskip("PIL.Image")
TOOL = Path(__file__).resolve().parents[2] / "tools" / "modelzoo_files.py"
_spec = importlib.util.spec_from_file_location("modelzoo_files", TOOL)
mz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mz)

BACKGROUND = [122, 116, 104]
TRANSFORMS = [{"name": "expand_to_square", "background_color": BACKGROUND}, {"name": "to_tensor"}]
SIZE = 28


def _shards(root: Path, rows: int = 4, features: int = 4, paths: list | None = None, ids: int = 500) -> Path:
    """One shard of ``rows`` samples; sample 0's image is 28 wide and 20 high, sample 1 has none."""
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "train").mkdir(exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (20, SIZE, 3), dtype=np.uint8)).save(root / "images" / "wide.png")
    data = rng.integers(0, ids, (rows, features, 16)).astype(np.int32)
    paths = paths if paths is not None else [[b"wide.png"], [None]] + [[b"wide.png"]] * (rows - 2)
    with h5py.File(root / "train" / "data-0.h5", "w") as f:
        f.create_dataset("data", data=data)
        if paths != "none":
            f.create_dataset("img_path", data=np.array(paths, dtype="S"))
    return root


def _loader(root: Path, **change):
    keys = dict(data_dir=str(root / "train"), img_data_dir=str(root / "images"), transforms=TRANSFORMS,
                batch_size=2, shuffle=False, image_model={"image_size": [SIZE, SIZE], "num_channels": 3},
                text_model={"vocab_size": 512})
    keys.update(change)
    return build_dataloader("train", **keys)


def test_rows_and_images_read_back_by_hand(tmp_path):
    root = _shards(tmp_path)
    batch = next(iter(_loader(root)))
    with h5py.File(root / "train" / "data-0.h5") as f:
        data = f["data"][:2]
    for i, name in enumerate(("text_input_ids", "loss_mask", "labels", "key_padding_mask")):
        assert batch[name].dtype == torch.int32 and np.array_equal(batch[name].numpy(), data[:, i])
    pixels = np.asarray(Image.open(root / "images" / "wide.png").convert("RGB"))
    square = np.empty((SIZE, SIZE, 3), np.uint8)
    square[:] = BACKGROUND  # the vendor's expand_to_square: centred, (28 - 20) // 2 = 4 rows above
    square[4:24] = pixels
    torch.testing.assert_close(batch["image_data"][0], torch.from_numpy(square).permute(2, 0, 1).float() / 255)
    assert torch.equal(batch["image_data"][1], torch.zeros(3, SIZE, SIZE))  # text only: a black image


def test_release_2_2_six_rows_read_back_by_hand(tmp_path):
    """Release 2.2's map of six rows: ids, loss mask, labels, attention span, positions, key padding."""
    root = _shards(tmp_path, features=6)
    batch = next(iter(_loader(root)))
    with h5py.File(root / "train" / "data-0.h5") as f:
        data = f["data"][:2]
    names = ("text_input_ids", "loss_mask", "labels", "attention_span", "position_ids", "key_padding_mask")
    assert set(batch) == {*names, "image_data"}
    for i, name in enumerate(names):
        assert batch[name].dtype == torch.int32 and np.array_equal(batch[name].numpy(), data[:, i])


def test_the_writer_of_tools_modelzoo_files_is_the_preprocessing_layout(tmp_path):
    """write_llava_data's samples, read back: the image placeholders are pad tokens, padded out as keys for a
    text-only sample and never scored; labels are the next inputs; the loss covers the completion and its eos."""
    mz.write_llava_data(tmp_path, rows=8, image_start_idx=3)
    batch = next(iter(_loader(tmp_path, data_dir=str(tmp_path / "train"), batch_size=8,
                              transforms=[{"name": "resize", "size": [SIZE, SIZE]}, {"name": "to_tensor"}])))
    ids, labels, mask, padding = (batch[k] for k in ("text_input_ids", "labels", "loss_mask", "key_padding_mask"))
    assert (ids[:, 0] == 1).all() and (ids[:, 3:7] == 0).all()
    assert torch.equal(ids[:, 1:][padding[:, 1:] == 0], labels[:, :-1][padding[:, 1:] == 0])
    assert (mask[:, :6] == 0).all()  # bos, the system tokens and the image are never scored ...
    for row_mask, row_labels in zip(mask, labels):  # ... the completion is, up to its eos, then nothing
        scored = row_mask.nonzero().flatten()
        assert torch.equal(scored, torch.arange(int(scored[0]), int(scored[-1]) + 1))
        assert row_labels[scored[-1]] == 2 and (row_labels[scored[:-1]] > 2).all()
    no_image = torch.tensor([i % 4 == 3 for i in range(8)])
    assert (padding[no_image, 3:7] == 1).all() and (padding[~no_image, 3:7] == 0).all()


@pytest.mark.parametrize("build, change, message", [
    (dict(paths="none"), {}, "needs 'img_path' of 4 byte strings"),
    (dict(features=3), {}, "holds 3 rows per sample; llava reads 4 (text_input_ids, loss_mask, labels, "
                           "key_padding_mask) or Release 2.2's 6"),
    (dict(paths=[[b"wide.png"], [b"gone.png"], [None], [None]]), {}, "gone.png (sample 1 of"),
    ({}, dict(transforms=[{"name": "to_tensor"}]), "transforms: the image of sample 0"),
    (dict(ids=600), {}, "holds token id"),
    ({}, dict(img_data_dir="/no/such/folder"), "train_input.img_data_dir: /no/such/folder is not a folder"),
    ({}, dict(use_vsl=True), "train_input.use_vsl"),
    ({}, dict(image_model=None, image_data_size=[3, 28]), "train_input.image_data_size"),
    ({}, dict(fp16_type="half"), "train_input.fp16_type: 'half' is not one of bfloat16"),
    ({}, dict(bos_token_id=-1), "train_input.bos_token_id: expected a token id"),
    ({}, dict(pad_token_id="0"), "train_input.pad_token_id: expected a token id"),
])
def test_bad_inputs_are_one_error_naming_what_and_where(tmp_path, build, change, message):
    root = _shards(tmp_path, **build)
    with pytest.raises(CsRunError) as e:
        for _ in _loader(root, **change):
            pass
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
