"""Both GPT data processors even the replicas' loaders (every replica the same number of batches, whatever
the shards' sizes), split as torch's DistributedSampler(shuffle=False) splits an epoch: it is the reference
for every replica's samples (which, in which order) and so for its batch count; with drop_last_batch each
replica's samples are disjoint from the others', without it they together cover every sample."""

from __future__ import annotations

import logging

import pytest
from torch.utils.data import DistributedSampler

from cs_run.data.processors import gpt_hdf5 as data
from tests.examples.gpt2_helpers import vendor_features, write_vendor_shards

MSL = 8


def _shards(folder, sizes):
    """Files of ``sizes`` samples (sorted by name in this order); sample k's first token is k."""
    start = 0
    for i, size in enumerate(sizes):
        samples = [vendor_features(list(range(k, k + MSL + 1)), MSL) for k in range(start, start + size)]
        write_vendor_shards(folder, samples, per_file=size, name=f"s{i}")
        start += size
    return start


def _firsts(loader):
    return [int(t) for batch in loader for t in batch["input_ids"][:, 0]]


# file sizes, replicas, global batch, drop_last_batch, num_samples (GptHDF5MapDataProcessor's epoch)
CASES = [
    ([20, 20, 20, 20, 17], 2, 4, True, None),   # one sample left out
    ([7, 13, 11], 3, 6, True, None),            # 31 over 3: 10 each
    ([7, 13, 11], 3, 6, False, None),           # 31 over 3: 11 each, 2 wrapped round
    ([5, 1, 1], 4, 4, False, None),             # more replicas than files
    ([3], 4, 4, False, None),                   # fewer samples than replicas: one wrapped round
    ([9, 4], 2, 2, True, None),                 # files of one replica's old share only: 13 -> 6 each
    ([7, 13, 11], 2, 4, False, 45),             # the Model Zoo's num_samples epoch, cycling the 31
]


@pytest.mark.parametrize("processor,sizes,world,batch,drop,num_samples", [
    (processor, *case) for case in CASES for processor in data.DATA_PROCESSORS
    if case[-1] is None or processor == "GptHDF5MapDataProcessor"])
def test_replicas_get_distributed_samplers_share_of_the_epoch(tmp_path, monkeypatch, processor, sizes, world, batch,
                                                             drop, num_samples):
    total = _shards(tmp_path, sizes)
    epoch = num_samples or total
    extra = {"num_samples": num_samples} if num_samples else {}
    monkeypatch.setenv("WORLD_SIZE", str(world))
    seen, lengths = [], set()
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        loader = data.build_dataloader("train", data_dir=str(tmp_path), batch_size=batch, shuffle=False,
                                       drop_last_batch=drop, data_processor=processor, **extra)
        reference = list(DistributedSampler(range(epoch), num_replicas=world, rank=rank, shuffle=False,
                                            drop_last=drop))
        per = batch // world
        assert len(loader) == (len(reference) // per if drop else -(-len(reference) // per))
        assert _firsts(loader) == [i % total for i in reference][:len(loader) * per if drop else None]
        lengths.add(len(loader))
        seen.append(_firsts(loader))
    assert len(lengths) == 1  # every replica steps the same number of batches
    flat = [k for share in seen for k in share]
    if drop:
        assert len(set(flat)) == len(flat)  # disjoint
    else:
        assert set(flat) == set(range(min(epoch, total)))  # covering


@pytest.mark.parametrize("processor", data.DATA_PROCESSORS)
def test_a_shuffled_share_is_a_permutation_of_the_same_samples_and_the_split_is_logged(
        tmp_path, monkeypatch, caplog, processor):
    _shards(tmp_path, [7, 13, 11])
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    kwargs = dict(data_dir=str(tmp_path), batch_size=2, drop_last_batch=True, data_processor=processor)
    with caplog.at_level(logging.INFO, logger="cs_run.data.processors.gpt_hdf5"):
        shuffled = _firsts(data.build_dataloader("train", shuffle=True, shuffle_seed=1, **kwargs))
    plain = _firsts(data.build_dataloader("train", shuffle=False, **kwargs))
    assert sorted(shuffled) == sorted(plain) == list(range(1, 30, 2)) and shuffled != plain
    assert "15 of the 31 samples to each of 2 streamers (the last 1 left out, as torch's " \
           "DistributedSampler(drop_last=True))" in caplog.text
