"""Tables of bad inputs to the gpt2 data path and its Hugging Face conversion, by class.

Three tables, each run through the CLI (``cs-run data preprocess``, ``cs-run train``, ``cs-run checkpoint
convert --from hf``): for every case the exit code, exactly one ``Error:`` line (the last line; progress
logged before it is allowed), the expected text naming the file, key or sample, no traceback, and nothing
already written lost (the earlier output, the shards, an existing DST compared byte for byte).

The references are independent of the code under test: damaged bytes are written here with h5py's chunk
map, a real Hugging Face folder comes from transformers' ``save_pretrained``, and the full disk and the
read-only filesystem are the kernel's (RLIMIT_FSIZE, a read-only mount in a private mount namespace).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from gpt2_helpers import WORDS, random_samples, tiny_params, write_corpus, write_vendor_shards

from cs_run.data.preprocessing import text_to_hdf5 as preprocess
from cs_run.data.readers.hdf5_samples import GptHDF5Dataset
from cs_run.errors import DataError
from cs_run.frontends.cli import cli
from cs_run.models.gpt2 import hf

PREP_ARGS = ["--max_seq_length", "16", "--vocab_size", "300"]


def _snapshot(folder: Path) -> dict:
    """Every path under ``folder`` (hidden ones too) with its bytes; None when ``folder`` does not exist."""
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def _one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert "Traceback" not in output, output
    assert lines and lines[-1].startswith("Error: "), output
    assert sum(line.startswith("Error:") for line in lines) == 1, output
    return lines[-1]


def _can_mount() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o ro none /mnt"], capture_output=True)
    return probe.returncode == 0


CAN_MOUNT = _can_mount()
_MAIN = ("import resource, signal, sys\n"
         "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
         "import cs_run.frontends.cli\n"
         "if sys.argv[1] == 'full-disk': resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
         "cs_run.frontends.cli.main(sys.argv[2:])\n")


# ----------------------------------------------------------------------------- cs-run data preprocess

@dataclasses.dataclass
class Prep:
    id: str
    args: list                 # after `data preprocess`; {in} good documents, {bad} bad files, {out}, {tmp}
    code: int
    message: str               # a part of the Error line, with the same placeholders
    files: dict = dataclasses.field(default_factory=dict)  # {bad}/<name> -> bytes
    old: bool = False          # an earlier run's output is in {out} (it must survive byte for byte)
    setup: typing.Any = None   # called with (tmp, out) after the old output is in place
    mode: str = "cli"          # cli (in process) | full-disk (RLIMIT_FSIZE) | ro-bind ({out} read-only) | ro-new


def _mkfifo(tmp, out):
    os.mkfifo(tmp / "bad" / "fifo.txt")


def _tokenizer_without_eos(tmp, out):
    tokenizers = pytest.importorskip("tokenizers")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([" ".join(WORDS)] * 10, vocab_size=280, special_tokens=[])
    bpe.save(str(tmp / "bad" / "no_eos.json"))


def _drop_splits(tmp, out):
    for split in ("train", "val"):
        shutil.rmtree((out / split).resolve())  # the set's folder; the link goes too
        (out / split).unlink()


PREP_CASES = [
    # inputs that are not UTF-8 text: the tokenizer trainer reads the files itself and would fail unnamed
    Prep("binary-random", ["{bad}/blob.txt", "{in}"], 2, "input {bad}/blob.txt is not UTF-8 text (byte 0x80 at offset "
         "128, line 2)", files={"blob.txt": bytes(range(256)) * 4}),
    Prep("binary-utf8-with-nul", ["{bad}/nul.txt", "{in}"], 2, "input {bad}/nul.txt is binary, not text (a NUL byte "
         "at offset 3)", files={"nul.txt": b"abc\x00def\n"}),
    Prep("latin-1", ["{in}", "{bad}/latin.txt"], 2, "input {bad}/latin.txt is not UTF-8 text (byte 0xe9 at offset 7, "
         "line 2)", files={"latin.txt": "one\ncaf\xe9\n".encode("latin-1")}),
    Prep("cp1252-quotes", ["{bad}/quotes.txt"], 2, "(byte 0x93 at offset 0, line 1)",
         files={"quotes.txt": "\u201cquoted\u201d".encode("cp1252")}),
    Prep("utf-16", ["{bad}/wide.txt"], 2, "(byte 0xff at offset 0, line 1)", files={"wide.txt": "hello".encode("utf-16")}),
    Prep("shift-jis", ["{bad}/sjis.txt"], 2, "input {bad}/sjis.txt is not UTF-8 text (byte 0x93 at offset 0",
         files={"sjis.txt": "日本語".encode("shift_jis")}),
    Prep("surrogate-bytes", ["{bad}/sur.txt"], 2, "(byte 0xed at offset 2, line 1)", files={"sur.txt": b"ab\xed\xa0\x80"}),
    Prep("cut-utf8-sequence", ["{bad}/cut.txt"], 2, "(byte 0xc3 at offset 3, line 1)", files={"cut.txt": b"caf\xc3"}),
    Prep("bad-file-found-in-folder", ["{in}"], 2, "input {in}/zz_bad.txt is not UTF-8 text",
         setup=lambda tmp, out: (tmp / "in" / "zz_bad.txt").write_bytes(b"\xff\xfe")),
    Prep("bad-file-with-overwrite", ["{in}", "{bad}/latin.txt", "--overwrite"], 2, "is not UTF-8 text",
         files={"latin.txt": b"caf\xe9"}, old=True),
    # inputs that are not documents
    Prep("only-empty-files", ["{bad}/empty.txt"], 2, "the 1 input document(s) are all empty", files={"empty.txt": b""}),
    Prep("dev-zero", ["/dev/zero"], 2, "input /dev/zero is not a regular file or a folder"),
    Prep("fifo", ["{bad}/fifo.txt"], 2, "input {bad}/fifo.txt is not a regular file or a folder", setup=_mkfifo),
    Prep("missing-input", ["{tmp}/nope.txt"], 2, "input {tmp}/nope.txt does not exist"),
    Prep("folder-without-matches", ["{bad}"], 2, "no files matching *.txt in {bad}", files={"a.md": b"text"}),
    # output folders that cannot be written or hold something else
    Prep("output-is-a-file", ["{in}"], 2, "is a file", setup=lambda tmp, out: out.write_text("x")),
    Prep("output-under-a-file", ["{in}", "-o", "{tmp}/afile/out"], 2,
         "cannot write to --output_dir {tmp}/afile/out (Not a directory)",
         setup=lambda tmp, out: (tmp / "afile").write_text("x")),
    Prep("split-folder-is-a-file", ["{in}"], 2, "{out}/train is a file, where the train shards go",
         setup=lambda tmp, out: (out.mkdir(), (out / "train").write_text("x"))),
    Prep("ro-filesystem-new-output", ["{in}", "-o", "{tmp}/ro/out"], 2,
         "cannot write to --output_dir {tmp}/ro/out (Read-only file system)", mode="ro-new"),
    Prep("ro-filesystem-overwrite", ["{in}", "--overwrite"], 2,
         "cannot write to --output_dir {out} (Read-only file system)", old=True, mode="ro-bind"),
    # earlier output: never replaced unasked, never lost when a replacement fails
    Prep("shards-exist", ["{in}"], 2, "{out}/train already holds *.h5 shards", old=True),
    Prep("tokenizer-exists", ["{in}"], 2, "{out}/tokenizer.json already exists", old=True, setup=_drop_splits),
    Prep("foreign-file-in-split", ["{in}", "--overwrite"], 2, "{out}/train holds notes.txt, which is not a shard",
         old=True, setup=lambda tmp, out: (out / "train" / "notes.txt").write_text("mine")),
    Prep("overwrite-bad-tokenizer-file", ["{in}", "--overwrite", "--tokenizer", "{bad}/tok.json"], 2,
         "--tokenizer {bad}/tok.json: not a tokenizers JSON file", files={"tok.json": b"{}"}, old=True),
    Prep("tokenizer-fifo", ["{in}", "--tokenizer", "{bad}/tok.json"], 2, "--tokenizer {bad}/tok.json is not a regular "
         "file", setup=lambda tmp, out: os.mkfifo(tmp / "bad" / "tok.json")),  # the reader blocked on it
    Prep("overwrite-tokenizer-without-eos", ["{in}", "--overwrite", "--tokenizer", "{bad}/no_eos.json"], 2,
         "the tokenizer has no <|endoftext|> token", old=True, setup=_tokenizer_without_eos),
    Prep("overwrite-full-disk-at-tokenizer", ["{in}", "--overwrite"], 1,
         "writing the output into {out} failed (", old=True, mode="full-disk"),
    Prep("overwrite-full-disk-at-shards", ["{in}", "--overwrite", "--tokenizer", "{out}/tokenizer.json"], 1,
         "writing the output into {out} failed ([Errno 27] File too large); nothing in it was changed", old=True,
         mode="full-disk"),
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def old_output(tmp_path_factory, corpus):
    pytest.importorskip("tokenizers")
    out = tmp_path_factory.mktemp("old") / "out"
    result = CliRunner().invoke(cli, ["data", "preprocess", str(corpus), "-o", str(out), *PREP_ARGS,
                                      "--eval_fraction", "0.25"])
    assert result.exit_code == 0, result.output
    return out


def _fill(text: str, tmp: Path, out: Path) -> str:
    return (text.replace("{in}", str(tmp / "in")).replace("{bad}", str(tmp / "bad")).replace("{out}", str(out))
            .replace("{tmp}", str(tmp)))


def _run_prep(case: Prep, args: list, tmp: Path, out: Path) -> tuple[int, str]:
    if case.mode == "cli":
        result = CliRunner().invoke(cli, ["data", "preprocess", *args])
        return result.exit_code, result.output
    command = [sys.executable, "-c", _MAIN, case.mode, "data", "preprocess", *args]
    if case.mode.startswith("ro-"):
        if not CAN_MOUNT:
            pytest.skip("needs unshare -m and mount (a private mount namespace)")
        target = out if case.mode == "ro-bind" else tmp / "ro"
        target.mkdir(exist_ok=True)
        mount = (f"mount --bind {target} {target} && mount -o remount,ro,bind {target}" if case.mode == "ro-bind"
                 else f"mount -t tmpfs -o ro none {target}")
        command = ["unshare", "-m", "sh", "-c", f'{mount} && exec "$@"', "sh", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("case", PREP_CASES, ids=[c.id for c in PREP_CASES])
def test_preprocess_bad_input(case, tmp_path, corpus, old_output):
    tmp, out = tmp_path, tmp_path / "out"
    shutil.copytree(corpus, tmp / "in")
    (tmp / "bad").mkdir()
    for name, data in case.files.items():
        (tmp / "bad" / name).write_bytes(data)
    if case.old:
        shutil.copytree(old_output, out, symlinks=True)
    if case.setup:
        case.setup(tmp, out)
    args = [_fill(a, tmp, out) for a in case.args] + PREP_ARGS
    if "-o" not in args:
        args += ["-o", str(out)]
    before = _snapshot(out) if out.is_dir() else out.exists()
    code, output = _run_prep(case, args, tmp, out)
    assert code == case.code, output
    line = _one_error_line(output)
    assert _fill(case.message, tmp, out) in line, line
    assert (_snapshot(out) if out.is_dir() else out.exists()) == before  # nothing written, nothing lost
    assert not (tmp / "afile" / "out").exists() and not list(tmp.rglob(".preprocess-*"))


def test_overwrite_replaces_everything_and_empty_documents_are_left_out(tmp_path, corpus, old_output):
    out = tmp_path / "out"
    shutil.copytree(old_output, out, symlinks=True)
    docs = tmp_path / "docs"
    shutil.copytree(corpus, docs)
    (docs / "empty.txt").write_bytes(b"")
    result = CliRunner().invoke(cli, ["data", "preprocess", str(docs), "-o", str(out), *PREP_ARGS,
                                      "--max_seq_length", "8", "--overwrite"])
    assert result.exit_code == 0, result.output
    assert "from 8 documents" in result.output  # the empty one is not a document
    # the old set goes whole: its val (another tokenizer's ids) is not left beside the new train
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["tokenizer.json", "train"]
    assert (out / "tokenizer.json").read_bytes() != (old_output / "tokenizer.json").read_bytes()
    with h5py.File(out / "train" / "examples_0.h5") as f:
        data = f["data"][...]
        assert f["data"].fletcher32 and f.attrs["max_token_id"] == data[:, [0, 2]].max()
        assert data.shape[2] == 8


# ----------------------------------------------------------------------------- shards read in training

def _write(train: Path, samples: list, writer: str) -> None:
    if writer == "vendor":
        write_vendor_shards(train, samples, per_file=6)
        return
    for start in (0, 6):
        w = preprocess.ShardWriter(train, samples[0].shape[-1], 6)
        for s in samples[start:start + 6]:
            w.add(s)
        w.flush()
        (train / "examples_0.h5").rename(train / f"ours_{start // 6}.h5")


def _chunk_bytes(sample: int):
    """Random bytes (seeded) over the stored chunk of ``sample`` in examples_1.h5, found with h5py's chunk map."""
    def damage(train: Path) -> None:
        path = sorted(train.glob("*.h5"))[1]
        with h5py.File(path) as f:
            info = f["data"].id.get_chunk_info(sample)
        raw = bytearray(path.read_bytes())
        raw[info.byte_offset:info.byte_offset + info.size] = np.random.default_rng(0).bytes(info.size)
        path.write_bytes(raw)
    return damage


def _set_token(sample: int, row: int, pos: int, value: int):
    def damage(train: Path) -> None:
        with h5py.File(sorted(train.glob("*.h5"))[1], "r+") as f:
            f["data"][sample, row, pos] = value
    return damage


def _replace_file(make):
    def damage(train: Path) -> None:
        path = sorted(train.glob("*.h5"))[1]
        good = h5py.File(path)["data"][...]
        path.unlink()
        make(path, good)
    return damage


def _h5(path, **datasets):
    with h5py.File(path, "w") as f:
        for name, data in datasets.items():
            if name == "attrs":
                f.attrs.update(data)
            else:
                f[name] = data


@dataclasses.dataclass
class ShardCase:
    id: str
    damage: typing.Callable[[Path], None]
    code: int
    message: str               # "{shard}": the damaged file (the second shard)
    writer: str = "vendor"     # vendor: the Model Zoo's writer (gpt2_helpers) | ours: ShardWriter
    vocab: int = 64            # the largest token id written + 1
    train_input: dict = dataclasses.field(default_factory=dict)
    args: list = dataclasses.field(default_factory=list)


SHARD_CASES = [
    ShardCase("chunk-random-bytes", _chunk_bytes(2), 1, "data_dir: {shard}: sample 2 cannot be read ("),
    ShardCase("chunk-random-bytes-checksummed", _chunk_bytes(4), 1, "data_dir: {shard}: sample 4 cannot be read (",
              writer="ours"),
    ShardCase("token-id-equal-vocab", _set_token(2, 0, 3, 64), 1, "data_dir: {shard}: sample 2 holds token id 64 in "
              "input_ids (position 3); ids must be in [0, model.vocab_size=64): set model.vocab_size to at least 65"),
    ShardCase("token-id-huge", _set_token(5, 0, 0, 2**31 - 1), 1, "sample 5 holds token id 2147483647 in input_ids"),
    ShardCase("label-too-big", _set_token(1, 2, 7, 1000), 1, "sample 1 holds token id 1000 in labels (position 7)"),
    ShardCase("negative-token", _set_token(3, 0, 1, -5), 1, "sample 3 holds token id -5 in input_ids (position 1); "
              "token ids are never negative"),
    ShardCase("negative-label", _set_token(0, 2, 0, -7), 1, "sample 0 holds token id -7 in labels (position 0)"),
    ShardCase("token-too-big-in-worker", _set_token(2, 0, 3, 64), 1, "sample 2 holds token id 64 in input_ids "
              "(position 3); ids must be in [0, model.vocab_size=64)", train_input={"num_workers": 2}),
    ShardCase("token-too-big-on-csx", _set_token(2, 0, 3, 64), 1, "sample 2 holds token id 64 in input_ids",
              args=["--device", "CSX", "--set", "runconfig.compile_tier=fx"]),
    ShardCase("recorded-max-token-id", lambda train: None, 2, "(its max_token_id), but model.vocab_size is 64; set "
              "model.vocab_size to at least", writer="ours", vocab=100),
    # the input's own vocab_size is ignored, as the Model Zoo's data processors do: the model's counts
    ShardCase("input-vocab-size-larger-than-the-models", _set_token(2, 0, 3, 64), 1, "sample 2 holds token id 64 in "
              "input_ids (position 3); ids must be in [0, model.vocab_size=64)", train_input={"vocab_size": 100}),
    ShardCase("truncated", lambda train: sorted(train.glob("*.h5"))[1].write_bytes(
        sorted(train.glob("*.h5"))[1].read_bytes()[:1500]), 2, "data_dir: {shard} is not a readable HDF5 file"),
    ShardCase("empty-file", lambda train: sorted(train.glob("*.h5"))[1].write_bytes(b""), 2,
              "data_dir: {shard} is not a readable HDF5 file"),
    ShardCase("not-hdf5", lambda train: sorted(train.glob("*.h5"))[1].write_text("text"), 2,
              "data_dir: {shard} is not a readable HDF5 file"),
    ShardCase("shard-is-a-folder", _replace_file(lambda path, good: path.mkdir()), 2,
              "data_dir: {shard} is not a readable HDF5 file"),
    ShardCase("no-data-dataset", _replace_file(lambda path, good: _h5(path, other=good)), 2,
              "data_dir: {shard} has no dataset 'data' (keys: other)"),
    ShardCase("float-dtype", _replace_file(lambda path, good: _h5(path, data=good.astype(np.float32))), 2,
              "data_dir: {shard} 'data' is float32[6, 3, 8]; expected integers"),
    ShardCase("two-rows", _replace_file(lambda path, good: _h5(path, data=good[:, :2])), 2,
              "data_dir: {shard} 'data' is int32[6, 2, 8]; expected integers"),
    ShardCase("flat", _replace_file(lambda path, good: _h5(path, data=good.reshape(-1))), 2,
              "data_dir: {shard} 'data' is int32[144]"),
    ShardCase("n-examples-too-big", _replace_file(lambda path, good: _h5(path, data=good, attrs={"n_examples": 9})), 2,
              "data_dir: {shard} attribute n_examples=9 but 'data' holds 6 rows"),
    ShardCase("other-sequence-length", _replace_file(lambda path, good: _h5(path, data=good[:, :, :4])), 2,
              "has max_sequence_length 4, other shards 8"),
]


@pytest.mark.parametrize("case", SHARD_CASES, ids=[c.id for c in SHARD_CASES])
def test_training_on_bad_shards(case, tmp_path):
    train, val = tmp_path / "train", tmp_path / "val"
    samples = random_samples(12, 8, case.vocab)
    _write(train, samples, case.writer)
    write_vendor_shards(val, random_samples(4, 8, 64), per_file=4)
    case.damage(train)
    params = tiny_params(tmp_path / "params.yaml", train, val, runconfig={"max_steps": 6}, batch_size=2)
    raw = yaml.safe_load(params.read_text())
    raw["train_input"].update(case.train_input)
    params.write_text(yaml.safe_dump(raw))
    before = _snapshot(train)
    md = tmp_path / "md"
    result = CliRunner().invoke(cli, ["train", "--params", str(params), "--model_dir", str(md), *case.args])
    assert result.exit_code == case.code, result.output
    line = _one_error_line(result.output)
    assert case.message.replace("{shard}", str(sorted(train.glob("*.h5"))[1])) in line, line
    assert _snapshot(train) == before
    assert not list(md.glob("checkpoint_*"))  # 6 steps of 2 = the 12 samples: the bad one is read before the end


@pytest.mark.parametrize("writer", ["vendor", "ours"])
def test_every_damaged_window_of_a_shard_is_an_error_naming_it(tmp_path, writer):
    """Random bytes (seeded) over every 32-byte window of a shard: each read gives the written samples or an
    error naming the shard (and the sample, once the file opened). Shards written by cs-run (per-chunk
    Fletcher-32) never give other samples; the Model Zoo's (no checksum) may, in a window of their chunk map."""
    samples = random_samples(6, 8, 64)
    _write(tmp_path / "base", samples + samples, writer)
    base = sorted((tmp_path / "base").glob("*.h5"))[0]
    good = base.read_bytes()
    rng = np.random.default_rng(1)
    outcomes = {"same": 0, "open": 0, "read": 0, "other samples": 0}
    for offset in range(0, len(good), 32):
        folder = tmp_path / f"w{offset}"
        folder.mkdir()
        raw = bytearray(good)
        raw[offset:offset + 32] = rng.bytes(len(raw[offset:offset + 32]))
        (folder / "examples_0.h5").write_bytes(raw)
        try:
            ds = GptHDF5Dataset(str(folder), vocab_size=64)
            rows = [ds[i]["input_ids"].numpy() for i in range(len(ds))]
        except ValueError as e:
            assert str(e).startswith(f"data_dir: {folder / 'examples_0.h5'} "), e
            outcomes["open"] += 1
            continue
        except DataError as e:
            assert str(e).startswith(f"data_dir: {folder / 'examples_0.h5'}: sample "), e
            outcomes["read"] += 1
            continue
        same = len(rows) == 6 and all((r == s[0]).all() for r, s in zip(rows, samples))
        outcomes["same" if same else "other samples"] += 1
    print(writer, outcomes)
    assert outcomes["open"] and outcomes["read"]  # both kinds of damage were met
    if writer == "ours":
        assert outcomes["other samples"] == 0


# ----------------------------------------------------------------------------- checkpoint convert --from hf

def _config(**changes):
    def edit(folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        for key, value in changes.items():
            if value is _DROP:
                cfg.pop(key, None)
            else:
                cfg[key] = value
        (folder / "config.json").write_text(json.dumps(cfg))
    return edit


_DROP = object()


def _tensors(edit):
    def damage(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(folder / "model.safetensors"))
        edit(tensors)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return damage


def _extra_layer(tensors):
    for key in [k for k in tensors if k.startswith("transformer.h.1.")]:
        tensors[key.replace(".h.1.", ".h.2.")] = tensors[key].clone()


@dataclasses.dataclass
class HfCase:
    id: str
    damage: typing.Callable[[Path], None]
    code: int
    message: str               # "{w}": the weights file, "{c}": config.json
    builds: bool = False       # the model has to be built (the weights read) to find this error


HF_CASES = [
    HfCase("config-one-layer-weights-two", _config(n_layer=1), 1, "{w}: the weights do not match config.json: "
           "config.json says n_layer=1 but the weights hold 2 layer(s) (h.0 .. h.1); not used by the config: "
           "h.1.attn.c_attn.bias"),
    HfCase("config-three-layers-weights-two", _config(n_layer=3), 1, "says n_layer=3 but the weights hold 2 layer(s) "
           "(h.0 .. h.1); missing: h.2.ln_1.weight"),
    HfCase("weights-for-a-third-layer", _tensors(_extra_layer), 1, "n_layer=2 but the weights hold 3 layer(s)"),
    HfCase("huge-layer-count", _config(n_layer=10**6), 1, "says n_layer=1000000 but the weights hold 2 layer(s)"),
    HfCase("huge-hidden-size", _config(n_embd=2**20, n_head=1), 1, "misshaped: wte.weight is [61, 24], the config "
           "says [61, 1048576]"),
    HfCase("huge-vocab", _config(vocab_size=10**9), 1, "wte.weight is [61, 24], the config says [1000000000, 24]"),
    HfCase("other-positions", _config(n_positions=32), 1, "wpe.weight is [20, 24], the config says [32, 24]"),
    HfCase("other-inner-size", _config(n_inner=48), 1, "h.0.mlp.c_fc.weight is [24, 40], the config says [24, 48]"),
    HfCase("n-inner-null-means-4x", _config(n_inner=None), 1, "h.0.mlp.c_fc.weight is [24, 40], the config says "
           "[24, 96]"),
    HfCase("missing-tensor", _tensors(lambda t: t.pop("transformer.h.0.mlp.c_fc.bias")), 1,
           "missing: h.0.mlp.c_fc.bias"),
    HfCase("extra-tensor", _tensors(lambda t: t.update({"transformer.h.0.attn.extra": t["transformer.ln_f.bias"].clone()})),
           1, "not used by the config: h.0.attn.extra"),
    HfCase("transposed-tensor", _tensors(lambda t: t.update(
        {"transformer.h.1.attn.c_attn.weight": t["transformer.h.1.attn.c_attn.weight"].t().contiguous()})), 1,
        "misshaped: h.1.attn.c_attn.weight is [72, 24], the config says [24, 72]"),
    HfCase("integer-tensor", _tensors(lambda t: t.update({"transformer.ln_f.bias": t["transformer.ln_f.bias"].int()})),
           1, "{w}: transformer.ln_f.bias (I32): not floating-point weights"),
    HfCase("untied-without-lm-head", _config(tie_word_embeddings=False), 1, "missing: lm_head.weight"),
    HfCase("tied-with-other-lm-head", _tensors(lambda t: t.update(
        {"lm_head.weight": t["transformer.wte.weight"] + 1})), 1,
        "lm_head.weight differs from wte.weight, but config.json says tie_word_embeddings=true", builds=True),
    HfCase("model-type-xlnet", _config(model_type="xlnet"), 2, "{c}: model_type: 'xlnet' has no Hugging Face converter"),
    HfCase("model-type-missing", _config(model_type=_DROP), 2, "{c}: model_type: None has no Hugging Face converter"),
    HfCase("layers-not-a-number", _config(n_layer="two"), 1, "config.json: n_layer: expected a positive integer, "
           "got 'two'"),
    HfCase("layers-negative", _config(n_layer=-1), 1, "config.json: n_layer: expected a positive integer, got -1"),
    HfCase("hidden-is-bool", _config(n_embd=True), 1, "config.json: n_embd: expected a positive integer, got True"),
    HfCase("heads-do-not-divide", _config(n_head=5), 1, "config.json: n_embd 24 is not a multiple of n_head 5"),
    HfCase("config-not-json", lambda d: (d / "config.json").write_text("{"), 1, "{c}: not valid JSON"),
    HfCase("config-a-list", lambda d: (d / "config.json").write_text("[1]"), 1,
           "{c}: expected a JSON object of settings, got list"),
    HfCase("weights-not-safetensors", lambda d: (d / "model.safetensors").write_bytes(b"garbage" * 10), 1,
           "{w}: not a readable safetensors file"),
    HfCase("weights-truncated", lambda d: (d / "model.safetensors").write_bytes(
        (d / "model.safetensors").read_bytes()[:5000]), 1, "{w}: not a readable safetensors file"),
    HfCase("weights-missing", lambda d: (d / "model.safetensors").unlink(), 1, "{w} not found"),
]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    config = transformers.GPT2Config(vocab_size=61, n_positions=20, n_embd=24, n_layer=2, n_head=3, n_inner=40)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder, safe_serialization=True)
    return folder


def test_the_untouched_hf_folder_converts(hf_folder, tmp_path):
    result = CliRunner().invoke(cli, ["checkpoint", "convert", "--from", "hf", str(hf_folder), str(tmp_path / "x.mdl")])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("case", HF_CASES, ids=[c.id for c in HF_CASES])
def test_convert_from_hf_bad_input(case, hf_folder, tmp_path, monkeypatch):
    folder = tmp_path / "hf"
    shutil.copytree(hf_folder, folder)
    case.damage(folder)
    dst = tmp_path / "old.mdl"
    dst.write_bytes(b"an earlier checkpoint")
    dst.with_suffix(".yaml").write_text("model: {}\n")
    before = dst.read_bytes(), dst.with_suffix(".yaml").read_bytes()
    built = []
    real_build = hf._build
    monkeypatch.setattr(hf, "_build", lambda keys: built.append(keys) or real_build(keys))
    result = CliRunner().invoke(cli, ["checkpoint", "convert", "--from", "hf", "--overwrite", str(folder), str(dst)])
    assert result.exit_code == case.code, result.output
    line = _one_error_line(result.output)
    assert case.message.replace("{w}", str(folder / "model.safetensors")).replace(
        "{c}", str(folder / "config.json")) in line, line
    assert bool(built) == case.builds  # sizes are compared with the file before a model is allocated
    assert (dst.read_bytes(), dst.with_suffix(".yaml").read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "old.mdl", "old.yaml"]
