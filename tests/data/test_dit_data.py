"""DiffusionLatentImageNet1KProcessor (dit's data) against the vendor's rules written out here: the sample order
(ShardedSampler: ``random.seed(shuffle_seed)``, ``random.shuffle``, the same order each epoch), the folder picked
per sample (CategoricalDataset: ``torch.multinomial`` on a generator seeded by shuffle_seed), the collate's draws
from torch's generator in the vendor's order (label dropout, timesteps, diffusion noise, VAE noise) and the
sampled, scaled latent; and its bad inputs, one error each naming the key or file."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from cs_run.data.processors.diffusion_latent import build_dataloader
from cs_run.errors import ParamsError

VAE = {"latent_size": [2, 2], "latent_channels": 4, "scaling_factor": 0.5}


def _write(root: Path, split: str, classes: int, per_class: int, seed: int) -> dict:
    """``root/split/c<k>/<i>.npz`` of random [8, 2, 2] moments; returns {path: (moments, label)}."""
    rng = np.random.default_rng(seed)
    files = {}
    for label in range(classes):
        (root / split / f"c{label}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            moments = np.concatenate([rng.normal(0, 3, (4, 2, 2)), rng.uniform(-4, 0, (4, 2, 2))]).astype(np.float32)
            path = root / split / f"c{label}" / f"{i}.npz"
            np.savez(path, vae_output=moments, label=np.int32(label))
            files[path] = (moments, label)
    return files


def _loader(data_dir, **keys):
    args = dict(data_dir=data_dir, batch_size=4, vae=VAE, label_dropout_rate=0.5, num_classes=1000,
                num_diffusion_steps=1000, shuffle=True, shuffle_seed=7, num_workers=0)
    return build_dataloader("train", **{**args, **keys})


def test_first_batches_are_the_vendor_rules_by_hand(tmp_path):
    a = _write(tmp_path / "a", "train", classes=2, per_class=3, seed=0)  # 6 samples
    b = _write(tmp_path / "b", "train", classes=2, per_class=2, seed=1)  # 4 samples
    torch.manual_seed(123)
    loader = _loader([str(tmp_path / "a"), str(tmp_path / "b")])
    batches = [batch for _, batch in zip(range(3), iter(loader))]  # one epoch of 6 (drop_last: 4), two more
    # the vendor's order: the indices of the longest folder, shuffled by Python's random with the seed, each epoch
    order = list(range(6))
    random.seed(7)
    random.shuffle(order)
    picks = torch.Generator().manual_seed(7)  # one folder draw per sample read, in reading order
    folders = [sorted(a.items()), sorted(b.items())]  # class folders, then files, sorted: the reading order
    reads = []
    for idx in order[:4] + order[:4] + order[:4]:
        folder = folders[int(torch.multinomial(torch.tensor([0.5, 0.5]), 1, generator=picks))]
        reads.append(folder[idx % len(folder)][1])
    torch.manual_seed(123)  # the loader drew nothing from torch's generator before the first collate
    for n, batch in enumerate(batches):
        moments = torch.from_numpy(np.stack([m for m, _ in reads[4 * n:4 * n + 4]]))
        labels = torch.tensor([label for _, label in reads[4 * n:4 * n + 4]], dtype=torch.int32)
        drop = torch.rand(4) < 0.5
        labels = torch.where(drop, torch.tensor(1000, dtype=torch.int32), labels)
        t = torch.randint(1000, (4,), dtype=torch.int32)
        eps, vae_noise = torch.randn(4, 4, 2, 2), torch.randn(4, 4, 2, 2)
        latent = (moments[:, :4] + torch.exp(0.5 * moments[:, 4:]) * vae_noise) * 0.5
        assert batch["label"].dtype == torch.int32 and batch["timestep"].dtype == torch.int32
        assert torch.equal(batch["label"], labels) and torch.equal(batch["timestep"], t)
        assert torch.equal(batch["diffusion_noise"], eps)
        torch.testing.assert_close(batch["input"], latent, rtol=1e-6, atol=1e-6)
    assert len(loader) == 1 and any(d for d in (batches[0]["label"] == 1000))  # label dropout happened


def test_the_eval_split_reads_val_in_file_order_and_names_a_file_of_the_wrong_shape(tmp_path):
    files = _write(tmp_path, "val", classes=1, per_class=4, seed=2)
    torch.manual_seed(5)
    batch = next(iter(build_dataloader("eval", data_dir=str(tmp_path), batch_size=4, vae=VAE, shuffle=True,
                                       shuffle_seed=3, label_dropout_rate=0.1)))
    moments = torch.from_numpy(np.stack([m for _, (m, _) in sorted(files.items())]))  # not shuffled: file order
    torch.manual_seed(5)
    torch.rand(4), torch.randint(1000, (4,), dtype=torch.int32), torch.randn(4, 4, 2, 2)  # dropout, t, noise
    latent = (moments[:, :4] + torch.exp(0.5 * moments[:, 4:]) * torch.randn(4, 4, 2, 2)) * 0.5
    torch.testing.assert_close(batch["input"], latent, rtol=1e-6, atol=1e-6)
    wrong = {"latent_size": [4, 4], "latent_channels": 4}
    with pytest.raises(ParamsError, match=r"0\.npz: vae_output has shape \[8, 2, 2\], expected \[8, 4, 4\]"):
        next(iter(build_dataloader("eval", data_dir=str(tmp_path), batch_size=4, vae=wrong)))


@pytest.mark.parametrize("case, keys, message", [
    ("no split folder", {}, r"^params: train_input\.data_dir: .*/train is not a folder; the layout is .*/train/<class>/"),
    ("no latents", {"files": {"a.txt": b"x"}}, r"^params: train_input\.data_dir: no latent files under .*/train/<class>/"),
    ("not npz", {"files": {"a.npz": b"not an archive"}}, r"a\.npz is not an \.npz file with a vae_output array"),
    ("no vae_output", {"files": {"a.npz": None}}, r"a\.npz is not an \.npz file with a vae_output array \(KeyError"),
    ("transforms", {"transforms": [{"name": "random_horizontal_flip"}]},
     r"^params: train_input\.transforms: .*not applied here, leave it empty"),
    ("no latent shape", {"vae": None}, r"^params: train_input\.latent_size: not set and the model gives none"),
    ("vae defaults", {"vae": {"scaling_factor": 0.5}, "files": {}, "latents": True},
     r"\d\.npz: vae_output has shape \[8, 2, 2\], expected \[8, 32, 32\]"),  # VAEConfig's latent_size, as dit's
    ("second folder missing", {"list": True}, r"^params: train_input\.data_dir\[1\]: .*/nowhere/train is not a folder"),
])
def test_bad_inputs_are_one_error_naming_key_or_file(tmp_path, case, keys, message):
    root = tmp_path / "d"
    for name, content in keys.pop("files", {}).items():
        (root / "train" / "c0").mkdir(parents=True, exist_ok=True)
        if content is None:
            np.savez(root / "train" / "c0" / name, label=np.int32(0))
        else:
            (root / "train" / "c0" / name).write_bytes(content)
    data_dir = [str(root), str(tmp_path / "nowhere")] if keys.pop("list", False) else str(root)
    if case == "second folder missing" or keys.pop("latents", False):
        _write(root, "train", classes=1, per_class=4, seed=0)
    with pytest.raises(ParamsError, match=message) as info:
        next(iter(_loader(data_dir, **{"batch_size": 1, **keys})))
    assert "\n" not in str(info.value)
