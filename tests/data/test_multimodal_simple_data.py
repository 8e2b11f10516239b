"""MultimodalSimpleHDF5MapDataProcessor: the samples of the vendor's multimodal preprocessing layout read back
(rows, up to max_num_img images and their img_data_loc by hand), the writer of tools/modelzoo_files.py checked
against that layout, and each bad input one error naming what and where."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from cs_run.data.processors.multimodal_simple_hdf5 import FEATURES, build_dataloader
from cs_run.errors import CsRunError

Image = pytest.importorskip("PIL.Image")
TOOL = Path(__file__).resolve().parents[2] / "tools" / "modelzoo_files.py"
_spec = importlib.util.spec_from_file_location("modelzoo_files", TOOL)
mz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mz)

SIZE, SEQ = 28, 16
RESIZE = [{"name": "resize", "size": [SIZE, SIZE]}, {"name": "to_tensor"}]


def _loader(root: Path, **change):
    keys = dict(data_dir=str(root / "train"), img_data_dir=str(root / "images"), transforms=RESIZE,
                image_data_size=[3, SIZE, SIZE], max_num_img=2, batch_size=2, shuffle=False,
                text_model={"vocab_size": 512})
    keys.update(change)
    return build_dataloader("train", **keys)


def _written(root: Path, **change) -> Path:
    mz.write_multimodal_simple_data(root, rows=6, max_num_img=2, max_sequence_length=SEQ, **change)
    return root


def test_rows_images_and_positions_read_back_by_hand(tmp_path):
    """Sample r holds r % 3 images: the rows are the file's, each used slot its image resized (bilinear, as
    torchvision's resize of a PIL image), an unused one black, img_data_loc the file's."""
    root = _written(tmp_path)
    batches = list(_loader(root, batch_size=3))
    with h5py.File(root / "train" / "data-0.h5") as f:
        data, paths, loc = f["data"][:], f["img_path"][:], f["img_data_loc"][:]
    batch = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    for i, name in enumerate(FEATURES):
        assert batch[name].dtype == torch.int32 and np.array_equal(batch[name].numpy(), data[:, i])
    assert np.array_equal(batch["image_data_loc"].numpy(), loc)
    for r in range(6):
        for slot in range(2):
            if slot < r % 3:
                pixels = Image.open(root / "images" / paths[r, slot].decode()).convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)
                expected = torch.from_numpy(np.asarray(pixels).copy()).permute(2, 0, 1).float() / 255
                assert paths[r, slot] != b"None"
                torch.testing.assert_close(batch["image_data"][r, slot], expected)
            else:
                assert paths[r, slot] == b"None" and (loc[r, slot] == SEQ).all()
                assert torch.equal(batch["image_data"][r, slot], torch.zeros(3, SIZE, SIZE))


def test_the_writer_of_tools_modelzoo_files_is_the_preprocessing_layout(tmp_path):
    """write_multimodal_simple_data's samples, read back: each image's positions are num_patches consecutive pad
    placeholders marked by token_modality_idx, never scored and attended; labels are the next inputs; the loss
    covers the completion and its eos; has_img says whether the first slot is used."""
    root = _written(tmp_path)
    batch = next(iter(_loader(root, batch_size=6)))
    ids, mask, labels, padding, modality, loc = (batch[k] for k in (*FEATURES, "image_data_loc"))
    with h5py.File(root / "train" / "data-0.h5") as f:
        assert f["has_img"][:, 0].tolist() == [r % 3 > 0 for r in range(6)]
    for r in range(6):
        used = loc[r][loc[r, :, 0] < SEQ]
        assert len(used) == r % 3
        image = torch.zeros(SEQ, dtype=torch.bool)
        for positions in used:
            assert torch.equal(positions, torch.arange(int(positions[0]), int(positions[0]) + 4))
            image[positions] = True
        assert torch.equal(modality[r].bool(), image)
        assert (ids[r][image] == 0).all() and (mask[r][image] == 0).all() and (padding[r][image] == 0).all()
        real = padding[r] == 0
        assert torch.equal(ids[r, 1:][real[1:]], labels[r, :-1][real[1:]])
        scored = mask[r].nonzero().flatten()
        assert torch.equal(scored, torch.arange(int(scored[0]), int(scored[-1]) + 1))
        assert labels[r, scored[-1]] == 2 and (labels[r, scored[:-1]] > 2).all()


def _damage(root: Path, name: str, value) -> Path:
    with h5py.File(root / "train" / "data-0.h5", "a") as f:
        del f[name]
        if value is not None:
            f.create_dataset(name, data=value)
    return root


@pytest.mark.parametrize("damage, change, message", [
    (("img_path", None), {}, "needs 'img_path' of [6, max_num_img=2] byte strings, got none"),
    (("img_data_loc", None), {}, "needs integer 'img_data_loc' of [6, max_num_img=2, num_patches], got none"),
    (("img_data_loc", np.zeros((6, 2, 4), np.float32)), {}, "got float32[6, 2, 4]"),
    (None, dict(max_num_img=1), "needs 'img_path' of [6, max_num_img=1]"),
    (None, dict(num_patches=9), "img_data_loc' of [6, max_num_img=2, num_patches=9], got int64[6, 2, 4]"),
    (("data", np.zeros((6, 4, SEQ), np.int32)), {}, "holds 4 rows per sample; multimodal_simple reads 5"),
    (("img_data_loc", np.full((6, 2, 4), SEQ + 1)), {}, "img_data_loc of sample 0"),
    (("data", np.full((6, 5, SEQ), 600, np.int32)), {}, "holds token id 600"),
    (None, dict(transforms=[{"name": "to_tensor"}]), "transforms: the image of sample 1"),
    (None, dict(img_data_dir="/no/such/folder"), "train_input.img_data_dir: /no/such/folder is not a folder"),
    (None, dict(use_vsl=True), "train_input.use_vsl"),
    (None, dict(image_data_size=None), "train_input.image_data_size: not set"),
    (None, dict(image_data_size=[3, SIZE]), "train_input.image_data_size: expected [channels, height, width]"),
    (None, dict(max_num_img=0), "train_input.max_num_img: expected a positive integer"),
])
def test_bad_inputs_are_one_error_naming_what_and_where(tmp_path, damage, change, message):
    root = _written(tmp_path)
    if damage:
        _damage(root, *damage)
    with pytest.raises(CsRunError) as e:
        for _ in _loader(root, **change):
            pass
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
