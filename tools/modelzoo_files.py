"""Run the params files of Model Zoo releases through ``cs-run validate-only`` (or train).

A harness for issue 25, not a test: it reads the Model Zoo's own params files from a local mirror of
github:Cerebras/modelzoo (nothing is copied into this repository), writes each to a scratch folder with
ONLY its sizes, batch sizes, step counts, data_dir and model_dir changed (2 layers, hidden 64, 4 heads,
filter 128, vocab 512, sequence 64, 2 kv groups, rotary_dim 16, batch 4, 5 steps), runs cs-run on it and
tallies the first ``Error:`` line of every file::

    cs-run data preprocess --stdlib -o /tmp/mz/shards --max_seq_length 64 --vocab_size 512 --eval_fraction 0.1
    python tools/modelzoo_files.py --shards /tmp/mz/shards --out /tmp/mz/run [--command train] [--device CSX]

esm2's files read MLM HDF5 shards (BertHDF5DataProcessor) and pre-masked CSV (BertCSVDataProcessor) for
validation: ``--write-esm2-data`` writes both, random protein-like sequences, into --shards' train/ and val/::

    python tools/modelzoo_files.py --shards /tmp/mz/esm2 --write-esm2-data --match nlp/esm2/configs/ --command train

dino's files read an ImageNet-layout image folder (DinoImageDataProcessor, and ImageNet1KProcessor for the
vision_transformer eval_linear file; crops of 4 patches per side, local crops of 2): ``--write-images``::

    python tools/modelzoo_files.py --shards /tmp/mz/images --write-images --match vision/dino/configs/ --command train

bert's files read CSV data (BertCSVDynamicMaskDataProcessor; a vocab_file moves to --shards/vocab.txt and
max_predictions_per_seq to 10): ``--write-bert-csv`` writes random word-piece pairs in the vendor's layout::

    python tools/modelzoo_files.py --shards /tmp/mz/bert --write-bert-csv --match nlp/bert/configs/ --command train

t5's files read text (T5DynamicDataProcessor; src_vocab_file moves to --shards/vocab.txt, 64 source and 16
target tokens): ``--write-t5-text`` writes random pieces in the vendor's layout (``--match nlp/t5/configs/``);
transformer's read parallel text, ``--write-transformer-text`` (``--match nlp/transformer/configs/``).
dpr's file reads DPRHDF5DataProcessor's shards (its q_encoder / ctx_encoder shrunk as a model):
``--write-dpr-data`` writes random questions with a positive and a hard-negative context (``--match nlp/dpr/``).

dit's files read VAE latents (DiffusionLatentImageNet1KProcessor; 8x8 latents, frequency_embedding_size 32):
``--write-dit-latents`` writes the vendor's ``.npz`` layout into --shards/dit/ (``--match vision/dit/``).

Every tag at once (docs/modelzoo_sweep.md): ``--all-tags`` lists the 23 tags' files in every layout
(:func:`params_files`), runs each distinct file (git blob id) once and reports per tag; ``--data-root`` writes each
family's data there (:func:`write_data`) and gives each file its family's; ``--first``/``--count`` run a chunk;
``--ok-from`` (the validate-only --json files) trains the fewest files that train every key and value of the
files that validated (:func:`train_cover`); ``--report`` prints the tables::

    flock /tmp/cs-run-heavy.lock python tools/modelzoo_files.py --all-tags --data-root /tmp/mz --in-process \
        --name-from-folder --first 0 --count 255 --json v0.json     # and 255, 510
    flock /tmp/cs-run-heavy.lock python tools/modelzoo_files.py --all-tags --data-root /tmp/mz --in-process \
        --name-from-folder --command train --ok-from v0.json v255.json v510.json --json t.json
    python tools/modelzoo_files.py --report v0.json v255.json v510.json --trained t.json

``--tag`` takes any release (older ones keep their files under ``transformers/pytorch/<family>/``);
``--name-from-folder`` names the model of a file without ``model.name`` by its family folder, as the
vendor's per-family ``run.py`` does. ``--json FILE`` writes every file's result; the table printed
groups the files by first error. ``--stub-model`` replaces the model by a stand-in that takes any
``model:`` keys (a bag-of-tokens LM; the inputs name the GPT data function), so the errors of everything
outside ``model:`` show. ``--in-process`` runs every file in this process (much faster; the CLI is
re-entered per file).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

import yaml

from cs_run._yaml import parse as parse_yaml

MIRROR = "/work/.mirror/Cerebras+modelzoo/repo"
FAMILIES = ("gpt2", "gpt3", "gptj", "gpt-neox", "gptneox", "llama", "mistral", "mixtral", "falcon", "gemma2",
            "starcoder", "santacoder", "jais", "btlm", "bloom", "mpt", "bert", "esm2", "t5", "transformer",
            "dit", "dino", "llava", "dpr", "fc_mnist", "vision_transformer", "dpo", "multimodal_simple")
"""Model families (models/nlp/<family>/..., models/vision/<family>/..., models/multimodal/<family>/..., fc_mnist/...):
the decoder LMs, bert (its pretraining files and its heads' files: --write-bert-csv also writes the classifier's
GLUE, the token classifier's NER and extractive summarization's BERTSUM data), esm2, t5, transformer, dit
(--write-dit-latents), dino (its DINOv2 files and the vision_transformer eval_linear file, --write-images), llava
(--write-llava-data's samples and images), dpr (--write-dpr-data), fc_mnist, vision_transformer, dpo and
multimodal_simple (--write-multimodal-simple-data); the other families (unet, ...) are left out."""
DECODERS = FAMILIES[:16]
DATA_OF = {**dict.fromkeys(DECODERS, "gpt"), "bert": "bert", "esm2": "esm2", "t5": "t5", "transformer": "transformer",
           "fc_mnist": "mnist", "vision_transformer": "imagenet", "dino": "imagenet", "dpo": "dpo", "dit": "dit",
           "llava": "llava", "dpr": "dpr", "multimodal_simple": "multimodal_simple"}
"""The data each family's files read: a folder of ``--data-root`` (:func:`write_data`), or fc_mnist's bundled digits."""

SWEEP_REFUSALS = {  # "<first tag>:<file>": words of its one error line (alternatives split by " | ")
    "R_1.6.0:bert/configs/bert_base_msl128.yaml": "buckets: bucketing by length",
    "R_1.6.0:bert/configs/bert_base_msl512.yaml": "buckets: bucketing by length",
    "R_1.6.0:bert/configs/bert_large_msl128.yaml": "buckets: bucketing by length",
    "R_1.6.0:bert/configs/bert_large_msl512.yaml": "buckets: bucketing by length",
    "R_1.6.0:bert/fine_tuning/extractive_summarization/configs/bert_base_summarization.yaml": "Zoo's ROUGE",
    "R_1.6.0:bert/fine_tuning/extractive_summarization/configs/bert_large_summarization.yaml": "Zoo's ROUGE",
    "R_1.6.0:bert/fine_tuning/qa/configs/bert_base_squad.yaml": "unknown model 'bert/qa'",
    "R_1.6.0:bert/fine_tuning/qa/configs/bert_large_squad.yaml": "unknown model 'bert/qa'",
    "R_1.7.0:bert/configs/bert_base_MSL128.yaml": "buckets: bucketing by length",
    "R_1.7.0:bert/configs/bert_base_MSL512.yaml": "buckets: bucketing by length",
    "R_1.7.0:bert/configs/bert_large_MSL128.yaml": "buckets: bucketing by length",
    "R_1.7.0:bert/configs/bert_large_MSL512.yaml": "buckets: bucketing by length",
    "R_1.7.0:bert/fine_tuning/extractive_summarization/configs/bert_base_summarization.yaml": "Zoo's ROUGE",
    "R_1.7.0:bert/fine_tuning/extractive_summarization/configs/bert_large_summarization.yaml": "Zoo's ROUGE",
    "R_1.7.0:bert/fine_tuning/qa/configs/bert_base_squad.yaml": "unknown key predict_input",
    "R_1.7.0:bert/fine_tuning/qa/configs/bert_large_squad.yaml": "unknown key predict_input",
    "R_1.7.0:gpt3/configs/params_gpt3_20b.yaml": "is given twice",
    "R_1.7.1:gpt3/configs/params_gpt3_20b.yaml": "is given twice",
    "Release_1.8.0:bert/fine_tuning/extractive_summarization/configs/bert_base_summarization.yaml": "Zoo's ROUGE",
    "Release_1.8.0:bert/fine_tuning/extractive_summarization/configs/bert_large_summarization.yaml": "Zoo's ROUGE",
    "Release_1.9.1:bert/fine_tuning/qa/configs/bert_base_squad.yaml": "unknown key predict_input",
    "Release_1.9.1:bert/fine_tuning/qa/configs/bert_large_squad.yaml": "unknown key predict_input",
    "Release_2.0.2:gpt3/configs/sparsity/pretraining/params_gpt3_125m_rigl75.yaml": "the Model Zoo 2.0/2.1 spelling",
    "Release_2.0.2:gpt3/configs/sparsity/pretraining/params_gpt3_125m_set75.yaml": "the Model Zoo 2.0/2.1 spelling",
    "Release_2.0.2:gpt3/configs/sparsity/pretraining/params_gpt3_125m_static75.yaml": "the Model Zoo 2.0/2.1 spelling",
    "Release_2.0.2:gpt3/configs/sparsity/pretraining/params_gpt3_6p7b_vspdf_phase1.yaml": "the Model Zoo 2.0/2.1 spelling",
    "Release_2.1.0:gpt3/configs/sparsity/pretraining/params_gpt3_125m_rigl75.yaml": "the Model Zoo 2.0/2.1 spelling",
    "Release_2.1.0:gpt3/configs/sparsity/pretraining/params_gpt3_125m_set75.yaml": "the Model Zoo 2.0/2.1 spelling",
    "Release_2.1.0:gpt3/configs/sparsity/pretraining/params_gpt3_125m_sparsewide-ift_rigl75.yaml": "the Model Zoo 2.0/2.1 spelling",
    "Release_2.1.0:gpt3/configs/sparsity/pretraining/params_gpt3_125m_sparsewide-ift_static50.yaml": "the Model Zoo 2.0/2.1 spelling",
    "Release_2.1.0:gpt3/configs/sparsity/pretraining/params_gpt3_125m_static75.yaml": "the Model Zoo 2.0/2.1 spelling",
    "Release_2.1.0:gpt3/configs/sparsity/pretraining/params_gpt3_6p7b_vspdf_phase1.yaml": "the Model Zoo 2.0/2.1 spelling",
    "Release_2.3.0:esm2/classification/configs/params_esm2_650M_UR50_classifier.yaml": "unknown model 'esm2/classification'",
    "Release_2.3.0:esm2/classification/configs/params_esm2_a10_UR50_classifier.yaml": "unknown model 'esm2/classification'",
    "Release_2.2.0:dpr/embedding_generation/configs/dpr_base_embed.yaml": "'DPREmbedGenHDF5DataProcessor' is not built here",
    "Release_2.2.0:dpr/embedding_generation/configs/dpr_nano_embed_synthetic.yaml": "'DPREmbedGenSyntheticDataProcessor' is not built here",
}
"""The files of the sweep of every tag refused by name (docs/modelzoo_sweep.md says why), by the tag each first
appears in (a later tag's byte-identical copy is the same file); tests/models/test_modelzoo_releases.py checks
the sweep against it."""
MODEL_SIZES = {"num_hidden_layers": 2, "hidden_size": 64, "num_heads": 4, "filter_size": 128, "vocab_size": 512,
               "max_position_embeddings": 64, "rotary_dim": 16}
DIT_SIZES = {"frequency_embedding_size": 32, "latent_size": [8, 8]}
"""dit's sizes beyond MODEL_SIZES: the timestep features and the latent [height, width] (model.vae.latent_size)."""
DIT_FOLDERS = ("latents", "latents_hflipped")
"""The two latent folders of the vendor's dit files (the images' latents and their mirror images')."""
DIT_CLASSES = 3  # class folders of --write-dit-latents (num_classes stays the files' 1000: a label-table size only)
T5_SIZES = {"d_model": 64, "d_kv": 16, "d_ff": 128, "encoder_num_hidden_layers": 2, "decoder_num_hidden_layers": 2,
            "src_vocab_size": 512, "tgt_vocab_size": 512, "src_max_position_embeddings": 64,
            "tgt_max_position_embeddings": 16}
"""t5's sizes: 64 source tokens (70 raw ones, 14 targets: data/processors/t5.raw_sequence_lengths) and 16 targets."""
IMAGE_CLASSES = 3  # write_images' class folders
IMAGE_PATCHES = 4  # a (global) image's patches per side: 56 x 56 pixels at patch 14
LOCAL_PATCHES = 2  # a dino local crop's patches per side (interpolate_position_embedding.local_patch_dims)
DINO_OUT, DINO_BOTTLENECK = 128, 32  # DinoHead output_size (the losses' input_size) and bottleneck_size
LLAVA_IMAGE_SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_heads": 4, "filter_size": 64, "image_size": [28, 28]}
"""llava's image tower: 28-pixel images of the files' 14-pixel patches, 4 patches (write_llava_data's images)."""
LLAVA_IMAGE_STARTS = (1, 35)
"""The image_start_idx values of the Release 2.10 llava files: --write-llava-data writes samples for each."""
LLAVA_2_2_FOLDER = "six_rows"
"""Under each llava/start_N: Release 2.2's six-row samples (write_llava_data six_rows), which its files read."""
DPR_LENGTH, DPR_CONTEXTS = 32, 2  # dpr's questions and contexts (a positive and a hard negative each)
MAX_PREDICTIONS = 10  # bert's max_predictions_per_seq: 15% of the 64-token sequence
MAX_CLS_TOKENS = 8  # extractive summarization's sentences per sample
KV_GROUPS = 2
SINK_TOKENS = 4
BATCH_SIZE = 4
STEPS = 5


def params_files(tag: str, mirror: str = MIRROR) -> list[tuple[str, str]]:
    """``(path, blob id)`` of the families' params files at ``tag``, in every layout the releases used:
    ``src/cerebras/modelzoo/models/{nlp,vision}/<family>/.../configs/`` (Release 2.2+),
    ``modelzoo/transformers/pytorch/<family>/.../configs/`` and ``modelzoo/vision/pytorch/<family>/configs/``
    (R_1.6.0 .. Release_2.1.1), and fc_mnist's ``.../fc_mnist/pytorch/configs/`` (before 2.5). The TensorFlow
    files of R_1.6 .. 1.8 (``transformers/tf/``) are not PyTorch params and are left out. Byte-identical files
    of two tags have the same blob id (:func:`sweep_jobs` runs each once)."""
    lines = subprocess.run(["git", f"--git-dir={mirror}", "ls-tree", "-r", tag], check=True,
                           capture_output=True, text=True).stdout.splitlines()
    files = []
    for line in lines:
        meta, _, name = line.partition("\t")
        if (family := family_of(name)) and family in FAMILIES:
            files.append((name, meta.split()[2]))
    return files


def decoder_files(tag: str, mirror: str = MIRROR) -> list[str]:
    """The paths of :func:`params_files` (the name kept for its callers: every family, not decoders only)."""
    return [name for name, _ in params_files(tag, mirror)]


_FAMILY_PATH = re.compile(r"(?:models/nlp|transformers/pytorch|models/vision|vision/pytorch|models/multimodal)/"
                          r"(?P<family>[^/]+)/(?:.*/)?configs/.*\.ya?ml$|(?P<mnist>fc_mnist)/pytorch/configs/.*\.ya?ml$")


def family_of(name: str) -> str | None:
    """The family folder of a params file's path, or None outside a family's ``configs/``."""
    m = _FAMILY_PATH.search(name)
    return (m.group("family") or m.group("mnist")) if m else None


def short_name(name: str) -> str:
    """A params file's path from its family folder on (the same in every layout)."""
    return re.split("models/nlp/|transformers/pytorch/|models/vision/|vision/pytorch/|models/multimodal/|"
                    "modelzoo/(?=fc_mnist/)", name)[-1]


def sweep_jobs(tags: list[str], mirror: str = MIRROR, match: str = "") -> tuple[list[tuple[str, str, str]], dict]:
    """The distinct files of ``tags`` to run, ``(path, tag, blob)`` at their first tag, and every tag's files as
    ``{tag: [(path, blob), ...]}``: a file byte-identical to one already listed (same blob id, same family) runs
    once, and its result stands for every tag that has it."""
    jobs, seen, per_tag = [], set(), {}
    for tag in tags:
        per_tag[tag] = [(name, blob) for name, blob in params_files(tag, mirror) if match in name]
        for name, blob in per_tag[tag]:
            if (blob, family_of(name)) not in seen:
                seen.add((blob, family_of(name)))
                jobs.append((name, tag, blob))
    return jobs, per_tag


_HEAD = re.compile(r"/(?P<family>bert|esm2)/(?:fine_tuning/)?(?P<head>classifier|token_classifier|extractive_summarization|qa|"
                   r"classification)/")


def _name_model(raw: dict, family: str, name: str = "") -> None:
    """``model.name`` from the file's folder where the file has none: the vendor runs each family's own
    ``run.py``, which names the model (Releases before 2.4 carry no model.name in their files); a head's folder
    with its own run.py (``bert/classifier/``, ``bert/fine_tuning/classifier/`` before 2.2, 2.3's
    ``esm2/classification/``) names ``<family>/<head>``."""
    if head := _HEAD.search(name):
        family = f"{head.group('family')}/{head.group('head')}"
    models = [t.get("init", {}).get("model") for t in (raw["trainer"] if isinstance(raw["trainer"], list)
                                                       else [raw["trainer"]])] if "trainer" in raw else [raw.get("model")]
    for model in models:
        if isinstance(model, dict) and "name" not in model:
            model["name"] = {"gptneox": "gpt-neox"}.get(family, family)


def _shrink_model(model: dict) -> None:
    if isinstance(model.get("image_model_list"), dict):  # multimodal_simple: its encoders, projections, text model
        _shrink_multimodal_simple(model)
        return
    for encoder in ("q_encoder", "ctx_encoder", "encoder"):  # dpr's encoders are bert models
        if isinstance(model.get(encoder), dict):
            _shrink_model(model[encoder])
    if isinstance(model.get("image_model"), dict):  # llava: its towers and projector (write_llava_data's images)
        model["image_model"].update(LLAVA_IMAGE_SIZES)
        _shrink_model(model["text_model"])
        projector = (model.get("projector") or {}).get("image_model")
        if isinstance(projector, dict):
            projector["input_unit"] = LLAVA_IMAGE_SIZES["hidden_size"]
            projector["layers_units"] = [MODEL_SIZES["hidden_size"]] * len(projector["layers_units"])
        return
    for key, value in {**MODEL_SIZES, **T5_SIZES}.items():
        if key in model:
            model[key] = value
    if isinstance(model.get("patch_size"), list) and "image_size" in model:  # a ViT: IMAGE_PATCHES per side
        model["image_size"] = [IMAGE_PATCHES * p for p in model["patch_size"]]
        if isinstance(model.get("interpolate_position_embedding"), dict):
            model["interpolate_position_embedding"]["local_patch_dims"] = [LOCAL_PATCHES, LOCAL_PATCHES]
    for trunk in model.get("image_model_trunks") or ():  # dino's parts
        _shrink_model(trunk["image_model"])
    for head in model.get("heads") or ():
        head["head_model"].update(input_size=MODEL_SIZES["hidden_size"], output_size=DINO_OUT,
                                  bottleneck_size=DINO_BOTTLENECK)
    for loss in model.get("losses") or ():
        if "input_size" in loss["loss"]:
            loss["loss"]["input_size"] = DINO_OUT
    extra = model.get("extra_attention_params")
    if isinstance(extra, dict) and "num_kv_groups" in extra:
        extra["num_kv_groups"] = KV_GROUPS
    for key in ("num_kv_groups",):
        if key in model:
            model[key] = KV_GROUPS
    if model.get("name") == "dit":
        model["frequency_embedding_size"] = DIT_SIZES["frequency_embedding_size"]
        for section in (model, model.get("vae") or {}):
            if section.get("latent_size") is not None:
                section["latent_size"] = list(DIT_SIZES["latent_size"])
    if model.get("attention_sink_tokens"):  # its data prepends that many sink tokens to each sample
        model["attention_sink_tokens"] = SINK_TOKENS
        model["max_position_embeddings"] = MODEL_SIZES["max_position_embeddings"] + SINK_TOKENS
    if isinstance(model.get("policy_model"), dict):  # dpo: the policy is a decoder LM's model section
        _shrink_model(model["policy_model"])


def _shrink_multimodal_simple(model: dict) -> None:
    """Each image encoder as llava's tower (LLAVA_IMAGE_SIZES: write_multimodal_simple_data's images), its
    projection onto that width, the global projection onto the text model's, and the text model."""
    width = LLAVA_IMAGE_SIZES["hidden_size"]
    for entry in model["image_model_list"].get("image_models") or ():
        parts = entry.get("image_model") if isinstance(entry, dict) else None  # Release 2.3: [encoder, projection]
        encoder, projection = (parts + [None])[:2] if isinstance(parts, list) and parts else \
            (entry.get("image_encoder"), entry.get("projection_layer")) if isinstance(entry, dict) else (None, None)
        if isinstance(encoder, dict):
            encoder.update(LLAVA_IMAGE_SIZES)
        if isinstance(projection, dict):
            projection.update(input_unit=width, layers_units=[width] * len(projection["layers_units"]))
    projection = model["image_model_list"].get("global_image_projection")
    if isinstance(projection, dict):
        projection["input_unit"] = width
        projection["layers_units"] = [MODEL_SIZES["hidden_size"]] * len(projection["layers_units"])
    if isinstance(model.get("text_model"), dict):
        _shrink_model(model["text_model"])


def _keep_tagged_layers(model: dict, optimizer: object) -> None:
    """As many layers as the optimizer's param-group patterns name (``*.layers.23.*``: 24), so that each
    tagged group still holds parameters (dino bs2048's per-layer learning rates)."""
    named = [int(n) for n in re.findall(r"\.layers\.(\d+)\.", json.dumps(optimizer))]
    if not named:
        return
    for part in [model] + [t["image_model"] for t in model.get("image_model_trunks") or ()]:
        if "num_hidden_layers" in part:
            part["num_hidden_layers"] = max(part["num_hidden_layers"], max(named) + 1)


def _shrink_images(section: dict, data_dir: str, side: int) -> None:
    """An image processor's section: the image folder (``data_dir`` is its split's folder) and the image sizes
    (``side``: the model's image side; DinoImageDataProcessor's from its patch size)."""
    root = str(Path(data_dir).parent)
    if section.get("data_processor") == "DinoImageDataProcessor":
        section["dataset"]["root"] = root
        crops, masks = section["ssl_transform"]["multi_crop_transform"], section["ssl_transform"]["masked_patch_transform"]
        patch = masks["patch_size"] if isinstance(masks["patch_size"], int) else masks["patch_size"][0]
        crops["global_image_size"] = masks["image_size"] = IMAGE_PATCHES * patch
        crops["local_image_size"] = LOCAL_PATCHES * patch
        return
    section["data_dir"] = root
    if section.get("num_classes") is not None:  # write_images' class folders
        section["num_classes"] = IMAGE_CLASSES
    if section.get("image_size") is not None:
        section["image_size"] = [side, side]
    for spec in section.get("transforms") or ():
        if isinstance(spec, dict) and "size" in spec:
            spec["size"] = [side + side // 8] * 2 if spec.get("name") == "resize" else [side, side]


def _shrink_input(section: dict, data_dir: str, side: int = 0, image_start_idx: int = 1) -> None:
    section["batch_size"] = BATCH_SIZE
    if section.get("data_processor") in ("DinoImageDataProcessor", "ImageNet1KProcessor"):
        _shrink_images(section, data_dir, side)
    elif "mixture" in section:
        for entry in section["mixture"]:
            entry["data_dir"] = data_dir
    elif "src_data_dir" not in section:
        section["data_dir"] = data_dir
    if section.get("max_sequence_length") is not None:
        section["max_sequence_length"] = MODEL_SIZES["max_position_embeddings"]
    if section.get("vocab_size") is not None:
        section["vocab_size"] = MODEL_SIZES["vocab_size"]
    if section.get("max_predictions_per_seq") is not None:
        section["max_predictions_per_seq"] = MAX_PREDICTIONS
    if section.get("src_data_dir") is not None:  # t5's text data (write_t5_text)
        section["src_data_dir"] = data_dir
        section["src_vocab_file"] = str(Path(data_dir).parent / "vocab.txt")
        section["src_max_sequence_length"] = T5_SIZES["src_max_position_embeddings"]
        section["tgt_max_sequence_length"] = T5_SIZES["tgt_max_position_embeddings"]
        section.pop("data_dir", None)
        if section.get("shuffle_buffer") is not None:
            section["shuffle_buffer"] = 4 * BATCH_SIZE
    if section.get("vocab_file") is not None:  # bert's CSV data: the word pieces of --shards (write_bert_csv)
        section["vocab_file"] = str(Path(data_dir).parent / "vocab.txt")
    masked = Path(data_dir).parent / "masked" / Path(data_dir).name
    if section.get("data_processor") == "BertCSVDataProcessor" and masked.exists():  # bert's (write_masked_bert_csv)
        section["data_dir"] = str(masked)
    if section.get("data_processor") == "BertTokenClassifierDataProcessor":  # NER CSV (write_ner_csv)
        section["data_dir"] = str(Path(data_dir).parent / "ner" / Path(data_dir).name)
        if section.get("label_vocab_file") is not None:  # Releases 1.6-2.1 keep it in the input
            section["label_vocab_file"] = str(Path(data_dir).parent / "ner" / "label2id.json")
    if section.get("data_processor") == "BertSumCSVDataProcessor":  # BERTSUM CSV (write_bertsum_csv)
        section["data_dir"] = str(Path(data_dir).parent / "bertsum" / Path(data_dir).name)
    if section.get("data_processor") == "DiffusionLatentImageNet1KProcessor":  # write_dit_latents' two folders
        section["data_dir"] = [str(Path(data_dir).parent / "dit" / name) for name in DIT_FOLDERS]
    if section.get("max_cls_tokens") is not None:
        section["max_cls_tokens"] = MAX_CLS_TOKENS
    if section.get("img_data_dir") is not None:  # llava's samples and images (write_llava_data), image where the model's
        llava = Path(data_dir).parent / "llava" / f"start_{image_start_idx}"
        if "bos_token_id" in section:  # Release 2.2's input keys: its files read the six-row samples
            llava = llava / LLAVA_2_2_FOLDER
        if section.get("data_processor") == "MultimodalSimpleHDF5MapDataProcessor":  # write_multimodal_simple_data
            llava = Path(data_dir).parent / "multimodal_simple"
        section["data_dir"] = str(llava / Path(data_dir).name)
        section["img_data_dir"] = str(llava / "images")
        section["image_data_size"] = [3, *LLAVA_IMAGE_SIZES["image_size"]]
        for transform in section.get("transforms") or ():
            if transform.get("name") in ("resize", "center_crop"):
                transform["size"] = LLAVA_IMAGE_SIZES["image_size"][0]
    if section.get("data_processor") == "MNISTDataProcessor" or str(data_dir).startswith("bundled:"):
        section["data_dir"] = "bundled:digits"  # fc_mnist: the bundled 8x8 digits (cs_run.data.processors.mnist)
    for transform in section.get("data_transforms") or ():
        if isinstance(transform, dict) and transform.get("name") == "add_sink_tokens":
            # sizes: the sinks fit the shrunk sequence (shards of max_position_embeddings - SINK_TOKENS
            # tokens would be the faithful copy; fewer sinks is the smaller change) and their id the vocabulary
            transform["num_sink_tokens"] = SINK_TOKENS
            transform["sink_token_id"] = MODEL_SIZES["vocab_size"] - 1


def _image_start(model: object) -> int:
    """llava's image_start_idx (its samples' placeholders start there), 1 by default and for other models."""
    return model.get("image_start_idx", 1) if isinstance(model, dict) else 1


STUB = '''"""A stand-in for the Model Zoo model of a params file: takes any model keys (tools/modelzoo_files.py)."""
import torch


class BagOfTokens(torch.nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, 16)
        self.decoder = torch.nn.Linear(16, vocab_size)

    def forward(self, batch):
        logits = self.decoder(self.embedding(batch["input_ids"]))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].long().flatten())


def build_model(vocab_size=512, **keys):
    return BagOfTokens(vocab_size)
'''
DATA_FN = "cs_run.data.processors.gpt_hdf5:build_dataloader"


def _stub(model: dict, inputs: list, folder: Path) -> None:
    (folder / "modelzoo_stub.py").write_text(STUB)
    model["name"] = "modelzoo_stub:build_model"
    for section in inputs:
        if isinstance(section, dict):
            section.setdefault("data_fn", DATA_FN)


def shrink(raw: dict, shards: Path, model_dir: Path, stub: bool = False) -> dict:
    """The params with only sizes, batch sizes, step counts, data_dir and model_dir changed (and with
    ``stub``, the model replaced by :data:`STUB`)."""
    raw = copy.deepcopy(raw)
    train, val = str(shards / "train"), str(shards / "val")
    if "trainer" in raw:
        trainers = raw["trainer"] if isinstance(raw["trainer"], list) else [raw["trainer"]]
        for trainer in trainers:
            init = trainer.setdefault("init", {})
            side = 0
            if isinstance(init.get("model"), dict):
                _shrink_model(init["model"])
                _keep_tagged_layers(init["model"], init.get("optimizer"))
                side = (init["model"].get("image_size") or [0])[0]
                if init["model"].get("label_vocab_file") is not None:  # the NER data's labels (write_ner_csv)
                    init["model"]["label_vocab_file"] = str(shards / "ner" / "label2id.json")
                if init["model"].get("vocab_file") is not None:  # summarization's: the word pieces of --shards
                    init["model"]["vocab_file"] = str(shards / "vocab.txt")
            init["model_dir"] = str(model_dir)
            loop = init.setdefault("loop", {})
            for key in ("max_steps", "num_steps"):
                if key in loop:
                    loop[key] = STEPS
            if "max_steps" not in loop and "num_steps" not in loop:
                loop["max_steps"] = STEPS
            if "eval_steps" in loop:
                loop["eval_steps"] = 2
            if "eval_frequency" in loop:
                loop["eval_frequency"] = STEPS
            if isinstance(init.get("checkpoint"), dict) and "steps" in init["checkpoint"]:
                init["checkpoint"]["steps"] = STEPS
            for part, key, path in (("fit", "train_dataloader", train), ("fit", "val_dataloader", val),
                                    ("validate", "val_dataloader", val), ("validate_all", "val_dataloaders", val)):
                section = (trainer.get(part) or {}).get(key)
                for entry in section if isinstance(section, list) else [section]:
                    if isinstance(entry, dict):
                        _shrink_input(entry, path, side, _image_start(init.get("model")))
            if stub and isinstance(init.get("model"), dict):
                _stub(init["model"], [(trainer.get(part) or {}).get(key) for part, key in (
                    ("fit", "train_dataloader"), ("fit", "val_dataloader"), ("validate", "val_dataloader"),
                    ("validate_all", "val_dataloaders"))], model_dir.parent)
        return raw
    side = 0
    if isinstance(raw.get("model"), dict):
        _shrink_model(raw["model"])
        side = (raw["model"].get("image_size") or [0])[0]
    for name, path in (("train_input", train), ("eval_input", val)):
        if isinstance(raw.get(name), dict):
            _shrink_input(raw[name], path, side, _image_start(raw.get("model")))
    rc = raw.setdefault("runconfig", {})
    rc["model_dir"] = str(model_dir)
    rc["max_steps"] = STEPS
    rc.pop("num_steps", None)
    for key in ("checkpoint_steps", "eval_frequency", "steps_per_epoch"):  # step counts
        if key in rc:
            rc[key] = STEPS
    if "eval_steps" in rc:
        rc["eval_steps"] = 2
    if stub and isinstance(raw.get("model"), dict):
        _stub(raw["model"], [raw.get("train_input"), raw.get("eval_input")], model_dir.parent)
    return raw


def write_bert_csv(out: Path, rows: int = 64, seed: int = 0) -> None:
    """BERT CSV data in the layout of the Model Zoo's create_csv.py (Release 2.10 lines 224-273, 320-326):
    ``train/`` and ``val/`` with ``meta.dat`` and a CSV of ``tokens``, ``segment_ids``, ``is_random_next``
    (sentence pairs of random word pieces, at most 64 tokens), and ``vocab.txt`` of 512 word pieces; and the
    classifier's GLUE files (:func:`write_glue_tsv`) in the same folders."""
    import csv  # noqa: PLC0415 - only this mode writes CSV
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = specials + [f"w{i}" if i % 4 else f"##p{i}" for i in range(MODEL_SIZES["vocab_size"] - len(specials))]
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.txt").write_text("\n".join(words) + "\n")
    for split in ("train", "val"):
        (out / split).mkdir(exist_ok=True)
        with open(out / split / "part_0.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["tokens", "segment_ids", "is_random_next"])
            writer.writeheader()
            for _ in range(rows):
                a, b = rng.randint(4, 30), rng.randint(4, 29)
                tokens = ["[CLS]", *rng.choices(words[5:], k=a), "[SEP]", *rng.choices(words[5:], k=b), "[SEP]"]
                writer.writerow({"tokens": str(tokens), "segment_ids": str([0] * (a + 2) + [1] * (b + 1)),
                                 "is_random_next": rng.randint(0, 1)})
        (out / split / "meta.dat").write_text(f"part_0.csv {rows}\n")
    write_masked_bert_csv(out / "masked", rows, rng)
    write_glue_tsv(out, words[5:], rows, rng)
    write_ner_csv(out / "ner", words[5:], rows, rng)
    write_bertsum_csv(out / "bertsum", rows, rng)


def write_masked_bert_csv(out: Path, rows: int, rng) -> None:
    """Pre-masked BERT CSV for bert's BertCSVDataProcessor (the MSL10k files of Releases 1.8-2.4; layout of
    data/processors/bert_csv.py): meta.dat and a CSV of ``input_ids``, ``attention_mask``, ``labels``,
    ``masked_lm_positions``, ``masked_lm_weights`` (MAX_PREDICTIONS gathered), ``next_sentence_label`` and
    ``token_type_ids``, sentence pairs of random ids ([CLS] 2, [SEP] 3, [MASK] 4) of at most 64 tokens."""
    import csv  # noqa: PLC0415 - only this mode writes CSV

    msl = MODEL_SIZES["max_position_embeddings"]
    for split in ("train", "val"):
        (out / split).mkdir(parents=True, exist_ok=True)
        with open(out / split / "part_0.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["input_ids", "attention_mask", "labels", "masked_lm_positions", "masked_lm_weights",
                             "next_sentence_label", "token_type_ids"])
            for _ in range(rows):
                a, b = rng.randint(4, 30), rng.randint(4, 29)
                ids = [2] + [rng.randrange(5, MODEL_SIZES["vocab_size"]) for _ in range(a)] + [3] + \
                    [rng.randrange(5, MODEL_SIZES["vocab_size"]) for _ in range(b)] + [3]
                positions = sorted(rng.sample([i for i, t in enumerate(ids) if t > 4], MAX_PREDICTIONS))
                labels = [ids[i] for i in positions]
                for i in positions:
                    ids[i] = 4
                pad = msl - len(ids)
                writer.writerow([str(ids + [0] * pad), str([1] * len(ids) + [0] * pad), str(labels), str(positions),
                                 str([1] * MAX_PREDICTIONS), str(rng.randint(0, 1)),
                                 str([0] * (a + 2) + [1] * (b + 1) + [0] * pad)])
        (out / split / "meta.dat").write_text(f"part_0.csv {rows}\n")


def write_bertsum_csv(out: Path, rows: int, rng) -> None:
    """BERTSUM CSV folders for bert/extractive_summarization's BertSumCSVDataProcessor (Release 2.10
    extractive_summarisation_utils.py lines 31, 53-86: meta.dat and CSVs of ``input_token_ids``, ``labels``,
    ``segment_ids``, ``cls_ids`` integer lists): up to 8 sentences of [CLS] (2) ... [SEP] (3), segments
    alternating per sentence, a 0/1 label per sentence, at most 64 tokens."""
    import csv  # noqa: PLC0415 - only this mode writes CSV

    for split in ("train", "val"):
        (out / split).mkdir(parents=True, exist_ok=True)
        with open(out / split / "part_0.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["input_token_ids", "labels", "segment_ids", "cls_ids"])
            for _ in range(rows):
                ids, segments, cls_ids = [], [], []
                for sentence in range(rng.randint(1, MAX_CLS_TOKENS)):
                    n = rng.randint(1, 5)
                    cls_ids.append(len(ids))
                    ids += [2] + [rng.randrange(5, MODEL_SIZES["vocab_size"]) for _ in range(n)] + [3]
                    segments += [sentence % 2] * (n + 2)
                labels = [rng.randint(0, 1) for _ in cls_ids]
                writer.writerow([str(ids), str(labels), str(segments), str(cls_ids)])
        (out / split / "meta.dat").write_text(f"part_0.csv {rows}\n")


NER_LABELS = ["[PAD]", "B", "I", "O", "X", "[CLS]", "[SEP]"]
"""ner_data_processor.py's BC5CDR labels (Release 2.10 lines 59 and 156), ids in this order (write_label_map_files)."""


def write_ner_csv(out: Path, words: list, rows: int, rng) -> None:
    """NER CSV folders for bert/token_classifier's BertTokenClassifierDataProcessor (Release 2.10: meta.dat, and
    CSVs of space-separated ``tokens`` and one of ``labels`` per word piece, [CLS] ... [SEP]) and label2id.json."""
    import csv  # noqa: PLC0415 - only this mode writes CSV
    import json  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    (out / "label2id.json").write_text(json.dumps({label: i for i, label in enumerate(NER_LABELS)}))
    for split in ("train", "val"):
        (out / split).mkdir(exist_ok=True)
        with open(out / split / "part_0.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["tokens", "labels"])
            writer.writeheader()
            for _ in range(rows):
                n = rng.randint(3, 60)
                pieces = rng.choices(words, k=n)
                labels = ["X" if w.startswith("##") else rng.choice("BIO") for w in pieces]
                writer.writerow({"tokens": " ".join(["[CLS]", *pieces, "[SEP]"]),
                                 "labels": " ".join(["[CLS]", *labels, "[SEP]"])})
        (out / split / "meta.dat").write_text(f"part_0.csv {rows}\n")


def write_glue_tsv(out: Path, words: list, rows: int, rng) -> None:
    """GLUE folders for bert/classifier's SST2DataProcessor and MNLIDataProcessor (Release 2.10
    BertClassifierDataProcessor.py read_tsv: tab-separated, a header; SST-2 ``sentence``, ``label``; MNLI
    ``sentence1``, ``sentence2``, ``gold_label``): ``train/train.tsv`` and ``val/dev.tsv``, ``dev_matched.tsv``,
    ``dev_mismatched.tsv``, each with both tasks' columns, of random whole words of the vocab."""
    labels = ("entailment", "neutral", "contradiction")
    whole = [w for w in words if not w.startswith("##")]
    for split, names in (("train", ("train.tsv",)), ("val", ("dev.tsv", "dev_matched.tsv", "dev_mismatched.tsv"))):
        for name in names:
            lines = ["sentence\tlabel\tsentence1\tsentence2\tgold_label"]
            for _ in range(rows):
                a, b = (" ".join(rng.choices(whole, k=rng.randint(3, 40))) for _ in range(2))
                lines.append(f"{a}\t{rng.randint(0, 1)}\t{a}\t{b}\t{rng.choice(labels)}")
            (out / split / name).write_text("\n".join(lines) + "\n")


ESM2_MASK, ESM2_PAD = 32, 1  # ESM-2's vocabulary: <cls> 0, <pad> 1, <eos> 2, amino acids 4..23, <mask> 32


def write_esm2_data(out: Path, rows: int = 32, seed: int = 0) -> None:
    """ESM-2 MLM data in the Model Zoo's layouts, sequences of 64 tokens at most (MODEL_SIZES), up to
    MAX_PREDICTIONS masked positions each, the masked ids replaced by the mask token, every other row two
    sequences packed (for the VSL file): ``train/`` and ``val/`` each hold the masked-LM HDF5 layout
    (data_params.json with training_objective mlm and mlm_with_gather, ``data`` [n, 4, msl] input_ids /
    attention_mask / attention_span / position_ids (the use_vsl rows; without use_vsl the first two are read),
    ``labels`` [n, 3, MAX_PREDICTIONS] labels /
    masked_lm_positions / masked_lm_mask) and the BertCSVDataProcessor CSV (meta.dat, columns
    input_ids, attention_mask, labels, masked_lm_positions, masked_lm_weights)."""
    import csv  # noqa: PLC0415 - only this mode writes CSV
    import random  # noqa: PLC0415

    import h5py  # noqa: PLC0415 - heavy optional import

    rng = random.Random(seed)
    msl = MODEL_SIZES["max_position_embeddings"]
    for split in ("train", "val"):
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        samples = []
        for row in range(rows):
            lengths = [rng.randint(msl // 4, msl)] if row % 2 else [rng.randint(8, msl // 2) for _ in range(2)]
            ids = [t for n in lengths for t in [0] + [rng.randint(4, 23) for _ in range(n - 2)] + [2]]
            spans = [n - 1 - i for n in lengths for i in range(n)]  # the VSL rows: tokens after, offset in document
            offsets = [i for n in lengths for i in range(n)]
            length = len(ids)
            positions = sorted(rng.sample(range(1, length - 1), min(MAX_PREDICTIONS, max(1, (length - 2) * 15 // 100))))
            labels = [ids[p] for p in positions]
            for p in positions:
                ids[p] = ESM2_MASK
            pad = msl - length
            extra = MAX_PREDICTIONS - len(positions)
            samples.append({"input_ids": ids + [ESM2_PAD] * pad, "attention_mask": [1] * length + [0] * pad,
                            "labels": labels + [0] * extra, "masked_lm_positions": positions + [0] * extra,
                            "masked_lm_weights": [1] * len(positions) + [0] * extra,
                            "attention_span": spans + [0] * pad, "position_ids": offsets + [0] * pad})
        (folder / "data_params.json").write_text(json.dumps({"dataset": {"training_objective": "mlm",
                                                                         "mlm_with_gather": True}}))
        with h5py.File(folder / "data-0.h5", "w") as f:
            f["data"] = [[s[k] for k in ("input_ids", "attention_mask", "attention_span", "position_ids")]
                         for s in samples]
            f["labels"] = [[s["labels"], s["masked_lm_positions"], s["masked_lm_weights"]] for s in samples]
        # the BertCSVDataProcessor CSV (Release 2.2's files train on it too)
        with open(folder / "part_0.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(samples[0])[:5])
            writer.writeheader()
            writer.writerows({k: str(s[k]) for k in writer.fieldnames} for s in samples)
        (folder / "meta.dat").write_text(f"part_0.csv {rows}\n")


def write_dpr_shards(out: Path, samples: int, length: int = DPR_LENGTH, num_context: int = DPR_CONTEXTS,
                     vocab_size: int = MODEL_SIZES["vocab_size"], seed: int = 0, samples_per_file: int = 0) -> None:
    """Random questions and contexts in the converter's layout (``dataset-partition-<k>.h5``, gzip, int32,
    ``data_params.json``): token 101 ([CLS]) first, a random length of word pieces, padding 0 masked."""
    import h5py  # noqa: PLC0415 - only the dpr data needs it
    import numpy as np  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)

    def rows(shape: tuple) -> np.ndarray:
        ids = rng.integers(1, vocab_size, size=(*shape, length))
        ids[..., 0] = min(101, vocab_size - 1)
        keep = np.arange(length) < rng.integers(length // 2, length + 1, size=(*shape, 1))
        ids = np.where(keep, ids, 0)
        return np.stack([ids, keep.astype(np.int64), np.zeros_like(ids)], axis=1)  # [n, 3, (contexts,) length]

    from cs_run.data.processors.dpr import CONTEXT_FEATURES, QUESTION_FEATURES  # noqa: PLC0415

    questions, contexts = rows((samples,)), rows((samples, num_context))
    per_file = samples_per_file or samples
    for k, start in enumerate(range(0, samples, per_file), 1):
        end = min(start + per_file, samples)
        with h5py.File(out / f"dataset-partition-{k}.h5", "w") as f:
            f.attrs["n_examples"] = end - start
            for name, data in (("data_0", questions[start:end]), ("data_1", contexts[start:end])):
                f.create_dataset(name, data=data.astype(np.int32), dtype="i4", chunks=(1, *data.shape[1:]),
                                 compression="gzip")
    params = {"n_examples": samples, "data_0_features": list(QUESTION_FEATURES), "data_0_features_len": 3,
              "data_0_max_sequence_length": length, "data_0_shape": [length],
              "data_1_features": list(CONTEXT_FEATURES), "data_1_features_len": 3,
              "data_1_max_sequence_length": length, "data_1_shape": [num_context, length],
              "output_dir": str(out), "dtype": "i4", "compression": "gzip", "samples_per_file": per_file}
    (out / "data_params.json").write_text(json.dumps(params, indent=4))


def write_dpr_data(out: Path, seed: int = 0) -> None:
    """dpr's train/ (48 questions in two files) and val/ (16) in the converter's layout (:func:`write_dpr_shards`)."""
    write_dpr_shards(out / "train", 48, seed=seed, samples_per_file=32)
    write_dpr_shards(out / "val", 16, seed=seed + 1)


def write_t5_text(out: Path, lines: int = 48, seed: int = 0) -> None:
    """T5 text data in the layout T5DynamicDataProcessor reads (preprocess_external.sh's output): ``train/`` and
    ``val/`` with ``meta.dat`` and a file of documents (one a line, 40 to 200 space-separated pieces), and
    ``vocab.txt`` of 512 pieces, the four special ones first."""
    import random  # noqa: PLC0415 - only this mode draws text

    rng = random.Random(seed)
    words = ["<pad>", "</s>", "<s>", "<unk>"] + [f"\u2581w{i}" for i in range(T5_SIZES["src_vocab_size"] - 4)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.txt").write_text("\n".join(words) + "\n")
    for split in ("train", "val"):
        (out / split).mkdir(exist_ok=True)
        docs = [" ".join(rng.choices(words[4:], k=rng.randint(40, 200))) for _ in range(lines)]
        (out / split / "c4-0.txt").write_text("\n".join(docs) + "\n")
        (out / split / "meta.dat").write_text(f"c4-0.txt {lines}\n")


def write_transformer_text(out: Path, lines: int = 48, seed: int = 0) -> None:
    """Parallel text in the layout TransformerDynamicDataProcessor reads: ``train/`` and ``val/`` with
    ``meta.dat`` (``src.txt tgt.txt <lines>``) and line-aligned files (sources of 5 to 60 pieces, targets of 3 to
    14: all within the 64 and 16 of T5_SIZES), and ``vocab.txt`` as :func:`write_t5_text`'s."""
    import random  # noqa: PLC0415 - only this mode draws text

    rng = random.Random(seed)
    words = ["<pad>", "</s>", "<s>", "<unk>"] + [f"w{i}" for i in range(T5_SIZES["src_vocab_size"] - 4)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.txt").write_text("\n".join(words) + "\n")
    for split in ("train", "val"):
        (out / split).mkdir(exist_ok=True)
        for name, (low, high) in (("src.txt", (5, 60)), ("tgt.txt", (3, 14))):
            text = [" ".join(rng.choices(words[4:], k=rng.randint(low, high))) for _ in range(lines)]
            (out / split / name).write_text("\n".join(text) + "\n")
        (out / split / "meta.dat").write_text(f"src.txt tgt.txt {lines}\n")


def write_images(out: Path, classes: int = IMAGE_CLASSES, per_class: int = 4, seed: int = 0) -> None:
    """Seeded random JPEGs in the ImageNet layout, ``out/{train,val}/<class>/<n>.JPEG`` (80 x 72 pixels, larger
    than every shrunk crop), for ImageNet1KProcessor and DinoImageDataProcessor."""
    import numpy as np  # noqa: PLC0415 - only the image writer needs these
    from PIL import Image  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for c in range(classes):
            folder = out / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (72, 80, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.JPEG")


def write_dit_latents(out: Path, per_class: int = 4, seed: int = 0) -> None:
    """VAE latents in the layout DiffusionLatentImageNet1KProcessor reads (the vendor's
    create_imagenet_latents.py output), in DIT_FOLDERS (the second the first mirrored left to right, standing for
    the flipped images' latents): ``train/`` and ``val/`` with DIT_CLASSES class folders of ``.npz`` files, each
    ``vae_output`` float32 ``[8, h, w]`` (4 latent channels' mean, then their log-variance, at DIT_SIZES'
    latent_size) and ``label`` (the folder's index)."""
    import numpy as np  # noqa: PLC0415 - only this mode writes arrays

    rng = np.random.default_rng(seed)
    h, w = DIT_SIZES["latent_size"]
    for split in ("train", "val"):
        for label in range(DIT_CLASSES):
            for i in range(per_class):
                moments = np.concatenate([rng.normal(0.0, 5.0, (4, h, w)), rng.uniform(-8.0, -2.0, (4, h, w))])
                for name, array in zip(DIT_FOLDERS, (moments, moments[:, :, ::-1])):
                    folder = out / name / split / f"n{label:08d}"
                    folder.mkdir(parents=True, exist_ok=True)
                    np.savez(folder / f"{i}.npz", vae_output=array.astype(np.float32),
                             label=np.array(label, dtype=np.int32))


def write_llava_data(out: Path, rows: int = 16, seed: int = 0, image_start_idx: int = 1, num_patches: int = 4,
                     max_sequence_length: int = MODEL_SIZES["max_position_embeddings"],
                     vocab_size: int = MODEL_SIZES["vocab_size"], pad_id: int = 0, bos_id: int = 1,
                     eos_id: int = 2, six_rows: bool = False) -> None:
    """LlavaHDF5MapDataProcessor's samples in ``out/train`` and ``out/val`` and their images in ``out/images``:
    the layout of the vendor's llava preprocessing (Release 2.10 hdf5_preprocessing
    create_features_llava_phase1 and hdf5_base_preprocessor's writer): ``data`` [n, 4, msl] int32 of
    input_ids, loss_mask, labels, key_padding_mask and ``img_path`` [n, 1] bytes. A sample is bos, the
    tokens before the image (``image_start_idx - 1`` of them: phase 2's system and user prompt; its
    create_features_llava_phase2's multi-turn samples and unscored assistant prompts are not modelled),
    ``num_patches`` pad placeholders, a prompt and a completion, eos, then padding; the loss is on the completion (from the token
    before it), the keys padded out are the padding and, for every fourth sample (text only, ``img_path``
    None), the placeholders. Token ids are below ``vocab_size - 1``, the image token id of the HF config llava's
adapter writes. Images are random RGB PNGs of varied sizes (``expand_to_square`` pads them). ``six_rows``: Release
2.2's layout (data/processors/llava_hdf5.FEATURES_2_2), one sample per row: its tokens' spans reach the sample's
last token (``length - 1 - i``) and positions count from 0, both 0 on the padding (the 2.2 VSL writer's rule)."""
    import h5py  # noqa: PLC0415 - only this writer needs these
    import numpy as np  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", rows), ("val", max(rows // 2, BATCH_SIZE))):
        data, paths = np.zeros((n, 4, max_sequence_length), np.int32), []
        spans, positions = np.zeros((n, max_sequence_length), np.int32), np.zeros((n, max_sequence_length), np.int32)
        for r in range(n):
            has_image = r % 4 != 3
            system = rng.integers(3, vocab_size - 1, image_start_idx - 1).tolist()
            prompt = rng.integers(3, vocab_size - 1, int(rng.integers(0, 4))).tolist()
            room = max_sequence_length + 1 - (1 + len(system) + num_patches + len(prompt) + 1)
            completion = rng.integers(3, vocab_size - 1, int(rng.integers(2, max(3, room // 2)))).tolist()
            tokens = [bos_id, *system, *[pad_id] * num_patches, *prompt, *completion, eos_id]
            scored = [0] * (len(tokens) - len(completion) - 2) + [1] * (len(completion) + 1) + [0]  # input positions
            attend = [1] * (1 + len(system)) + [int(has_image)] * num_patches + [1] * (len(tokens) - 1 - len(system)
                                                                                      - num_patches)
            length = len(tokens) - 1
            data[r, 0, :length], data[r, 2, :length] = tokens[:-1], tokens[1:]
            data[r, 1, :length] = scored[:length]
            data[r, 3] = 1
            data[r, 3, :length] = [1 - a for a in attend[:length]]
            spans[r, :length], positions[r, :length] = np.arange(length - 1, -1, -1), np.arange(length)
            if has_image:
                name = f"{split}_{r}.png"
                h, w = int(rng.integers(20, 40)), int(rng.integers(20, 40))
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(images / name)
                paths.append([name.encode()])
            else:
                paths.append([None])
        (out / split).mkdir(parents=True, exist_ok=True)
        if six_rows:  # ids, loss mask, labels, span, position, key padding
            data = np.stack([data[:, 0], data[:, 1], data[:, 2], spans, positions, data[:, 3]], axis=1)
        with h5py.File(out / split / "data-0.h5", "w") as f:
            f.attrs["n_examples"] = n
            f.create_dataset("data", data=data)
            f.create_dataset("img_path", data=np.array(paths, dtype="S"))


def write_multimodal_simple_data(out: Path, rows: int = 16, seed: int = 0, max_num_img: int = 1, num_patches: int = 4,
                                 max_sequence_length: int = MODEL_SIZES["max_position_embeddings"],
                                 vocab_size: int = MODEL_SIZES["vocab_size"], pad_id: int = 0, bos_id: int = 1,
                                 eos_id: int = 2) -> None:
    """MultimodalSimpleHDF5MapDataProcessor's samples in ``out/train`` and ``out/val`` and their images in
    ``out/images``: the layout of the vendor's multimodal preprocessing (Release 2.10 finetuning_token_generator
    encode with is_multimodal, create_features_multimodal): ``data`` [n, 5, msl] int32 of input_ids, loss_mask,
    labels, key_padding_mask, token_modality_idx; ``img_path`` [n, max_num_img] bytes (None: an unused slot);
    ``has_img`` [n, 1] bool; ``img_data_loc`` [n, max_num_img, num_patches] int (each image's ``num_patches``
    positions, msl for an unused slot). A sample is bos, then per image a few text tokens and ``num_patches``
    pad placeholders (the image's, token_modality_idx 1), a prompt, a scored completion, eos, then padding
    (key_padding_mask 1); sample ``r`` has ``r % (max_num_img + 1)`` images, so some have none. Images are
    random RGB PNGs of varied sizes (``expand_to_square`` pads them)."""
    import h5py  # noqa: PLC0415 - only this writer needs these
    import numpy as np  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", rows), ("val", max(rows // 2, BATCH_SIZE))):
        data = np.zeros((n, 5, max_sequence_length), np.int32)
        paths, loc = [], np.full((n, max_num_img, num_patches), max_sequence_length, np.int64)
        for r in range(n):
            tokens, modality, names = [bos_id], [0], []
            for i in range(r % (max_num_img + 1)):
                text = rng.integers(3, vocab_size - 1, int(rng.integers(0, 3))).tolist()
                tokens += text
                modality += [0] * len(text)
                loc[r, i] = np.arange(len(tokens), len(tokens) + num_patches)
                tokens += [pad_id] * num_patches
                modality += [1] * num_patches
                name = f"{split}_{r}_{i}.png"
                h, w = int(rng.integers(20, 40)), int(rng.integers(20, 40))
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(images / name)
                names.append(name.encode())
            prompt = rng.integers(3, vocab_size - 1, int(rng.integers(0, 4))).tolist()
            room = max_sequence_length + 1 - (len(tokens) + len(prompt) + 1)
            completion = rng.integers(3, vocab_size - 1, int(rng.integers(2, max(3, room // 2)))).tolist()
            tokens += [*prompt, *completion, eos_id]
            modality += [0] * (len(prompt) + len(completion) + 1)
            scored = [0] * (len(tokens) - len(completion) - 2) + [1] * (len(completion) + 1)  # input positions
            length = len(tokens) - 1
            data[r, 0, :length], data[r, 2, :length] = tokens[:-1], tokens[1:]
            data[r, 1, :length] = scored[:length]
            data[r, 3, length:] = 1
            data[r, 4, :length] = modality[:length]
            paths.append(names + [None] * (max_num_img - len(names)))
        (out / split).mkdir(parents=True, exist_ok=True)
        with h5py.File(out / split / "data-0.h5", "w") as f:
            f.attrs["n_examples"] = n
            f.create_dataset("data", data=data)
            f.create_dataset("img_path", data=np.array(paths, dtype="S"))
            f.create_dataset("has_img", data=np.array([[bool(p[0])] for p in paths]))
            f.create_dataset("img_data_loc", data=loc)


def write_dpo_shards(out: Path, pairs: int = 16, seed: int = 0) -> None:
    """DPO shards as the vendor's DPOTokenGenerator writes them (Release 2.10 dpo_token_generator.py lines 428-501:
    per sample the rows chosen input_ids, attention_mask, labels, then the rejected ones, ``[n, 6, msl]`` with
    attribute n_examples; labels shifted left, no loss on the prompt) in ``train/`` and ``val/``."""
    import h5py  # noqa: PLC0415 - heavy optional import
    import numpy as np  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    msl, vocab = MODEL_SIZES["max_position_embeddings"], MODEL_SIZES["vocab_size"]
    for split in ("train", "val"):
        samples = []
        for _ in range(pairs):
            prompt = rng.integers(1, vocab, int(rng.integers(3, 9))).tolist()
            rows = []
            for _answer in range(2):
                tokens = prompt + rng.integers(1, vocab, int(rng.integers(2, msl - len(prompt) + 1))).tolist()
                labels = tokens[1:] + [0]
                labels[: len(prompt) - 1] = [0] * (len(prompt) - 1)
                mask = [0] * (len(prompt) - 1) + [1] * (len(tokens) - len(prompt) + 1)
                rows += [row + [0] * (msl - len(row)) for row in (tokens, mask, labels[: len(tokens)])]
            samples.append(rows)
        (out / split).mkdir(parents=True, exist_ok=True)
        with h5py.File(out / split / "data-0.h5", "w") as f:
            f.create_dataset("data", data=np.array(samples, dtype=np.int32))
            f.attrs["n_examples"] = pairs


def write_llava_from_config(out: Path, config: str, cs_run: str) -> None:
    """llava samples in ``out/train`` and ``out/val`` written by ``cs-run data preprocess --config`` of a Model Zoo
    llava preprocessing config (its setup.output_dir replaced), and its setup.image_dir copied to ``out/images``:
    the vendor tool's layout from records, for a file whose image_start_idx is where the config's chat template
    puts the image."""
    import shutil  # noqa: PLC0415 - only this writer needs it

    params = yaml.safe_load(Path(config).read_text())
    for split in ("train", "val"):
        params["setup"]["output_dir"] = str(out / split)
        written = out / f"{split}.yaml"
        written.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(yaml.safe_dump(params, sort_keys=False))
        subprocess.run([cs_run, "data", "preprocess", "--config", str(written)], check=True, capture_output=True)
    shutil.copytree(params["setup"]["image_dir"], out / "images", dirs_exist_ok=True)


def write_llava_folders(out: Path, llava_config: Optional[str] = None, cs_run: str = "cs-run") -> None:
    """llava's samples under ``out/llava/start_N`` for each of LLAVA_IMAGE_STARTS, each with Release 2.2's six-row
    copy in LLAVA_2_2_FOLDER; with ``llava_config`` start_1's come from the vendor tool's config
    (:func:`write_llava_from_config`)."""
    for start in LLAVA_IMAGE_STARTS:
        folder = out / "llava" / f"start_{start}"
        if llava_config and start == 1:
            write_llava_from_config(folder, llava_config, cs_run)
        else:
            write_llava_data(folder, image_start_idx=start)
        write_llava_data(folder / LLAVA_2_2_FOLDER, image_start_idx=start, six_rows=True)


DATA_WRITERS: dict[str, Callable[[Path], None]] = {
    "bert": write_bert_csv, "esm2": write_esm2_data, "t5": write_t5_text, "transformer": write_transformer_text,
    "imagenet": write_images, "dpo": write_dpo_shards, "dit": lambda out: write_dit_latents(out / "dit"),
    "dpr": write_dpr_data, "llava": write_llava_folders,
    "multimodal_simple": lambda out: write_multimodal_simple_data(out / "multimodal_simple")}
"""Each written data folder of DATA_OF by its name: the writer of the folder it is given."""

WRITE_FLAGS = {"write_dit_latents": "dit", "write_images": "imagenet", "write_bert_csv": "bert",
               "write_esm2_data": "esm2", "write_llava_data": "llava",
               "write_multimodal_simple_data": "multimodal_simple", "write_dpr_data": "dpr", "write_t5_text": "t5",
               "write_transformer_text": "transformer"}
"""Each ``--write-*`` flag's DATA_WRITERS entry, written under ``--shards`` in this order."""


def write_data(root: Path, kinds: set, cs_run: str) -> None:
    """Each data folder of DATA_OF that ``kinds`` names, under ``root/<kind>`` (written once: kept if there)."""
    for kind in sorted(kinds - {"mnist"}):
        if (root / kind / ".written").exists():
            continue
        if kind == "gpt":
            subprocess.run([cs_run, "data", "preprocess", "--stdlib", "-o", str(root / kind), "--max_seq_length",
                            str(MODEL_SIZES["max_position_embeddings"]), "--vocab_size",
                            str(MODEL_SIZES["vocab_size"]), "--eval_fraction", "0.1"], check=True,
                           capture_output=True)
        else:
            DATA_WRITERS[kind](root / kind)
        (root / kind / ".written").touch()


def shards_of(name: str, args) -> Path:
    """The data a file reads: --shards, or with --data-root its family's folder (fc_mnist: the bundled digits)."""
    if not args.data_root:
        return Path(args.shards)
    kind = DATA_OF[family_of(name)]
    return Path("bundled:digits") if kind == "mnist" else Path(args.data_root) / kind


def all_tags(mirror: str = MIRROR) -> list[str]:
    """Every release tag of the mirror, oldest first (R_1.6.0 .. Release_2.10.0)."""
    tags = subprocess.run(["git", f"--git-dir={mirror}", "tag"], check=True, capture_output=True, text=True).stdout
    return sorted(tags.split(), key=lambda t: [int(n) for n in re.findall(r"\d+", t)])


def first_error(output: str, rc: int) -> str:
    """The first ``Error:`` line, or a traceback's last line, or ``ok``."""
    for line in output.splitlines():
        if line.startswith("Error:"):
            return line
    if rc == 0:
        return "ok"
    tail = [line for line in output.splitlines() if line.strip()]
    return f"rc={rc}: {tail[-1] if tail else ''}"


def shrunk_params(name: str, tag: str, args, model_dir: Path) -> dict:
    """The tiny copy of the file ``name`` at ``tag`` that cs-run runs (:func:`shrink`)."""
    text = subprocess.run(["git", f"--git-dir={args.mirror}", "show", f"{tag}:{name}"], check=True,
                          capture_output=True, text=True).stdout
    raw, _ = parse_yaml(text, name)  # as cs-run reads params (YAML 1.2 floats such as 1e-05)
    if args.name_from_folder:
        _name_model(raw, family_of(name), name)
    return shrink(raw, shards_of(name, args), model_dir, args.stub_model)


TRAIN_IGNORED = frozenset({
    "model_dir", "data_dir", "log_steps", "checkpoint_steps", "save_losses", "save_initial_checkpoint",
    "num_workers", "prefetch_factor", "persistent_workers", "use_worker_cache", "eval_steps", "eval_frequency",
    "logging", "checkpoint", "callbacks", "backend", "loop", "runconfig", "csconfig", "val_dataloader",
    "eval_input", "validate", "validate_all", "max_wgt_servers", "num_csx", "num_wgt_servers", "num_act_servers"})
"""Keys that do not change what 5 CPU training steps run (bookkeeping, appliance settings, evaluation)."""


def train_features(params: dict, family: str) -> set:
    """What of a file's 5 CPU training steps can differ from another file's: every leaf of its shrunk params
    without :data:`TRAIN_IGNORED`'s keys, as ``family:path=value``, a number as ``#`` (a learning rate, a dropout
    rate or an initializer's std changes values, not the code that runs), list items under one ``[]``."""
    def leaves(value, path):
        if isinstance(value, dict):
            for k, v in value.items():
                if k not in TRAIN_IGNORED:
                    yield from leaves(v, f"{path}.{k}")
        elif isinstance(value, list):
            for v in value:
                yield from leaves(v, f"{path}[]")
        else:
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            yield f"{family}:{path}=" + ("#" if number else json.dumps(value, default=str))
    return set(leaves(params, ""))


def train_cover(jobs: list, args) -> list:
    """The files to train: greedily, the file with the most :func:`train_features` not yet trained, until every
    feature of every file in ``jobs`` is trained by one file (761 distinct files of 23 tags: 114 files)."""
    features = {job: train_features(shrunk_params(job[0], job[1], args, Path("model_dir")), family_of(job[0]))
                for job in jobs}
    todo, chosen = set().union(*features.values()) if features else set(), []
    while todo:
        job = max(features, key=lambda j: len(features[j] & todo))
        chosen.append(job)
        todo -= features[job]
    return chosen


def run_one(name: str, tag: str, args) -> dict:
    slug = re.sub(r"[^\w.-]+", "_", short_name(name))
    folder = Path(args.out) / tag / slug
    folder.mkdir(parents=True, exist_ok=True)
    params = folder / "params.yaml"
    params.write_text(yaml.safe_dump(shrunk_params(name, tag, args, folder / "model_dir"), sort_keys=False))
    command = [args.command, "--params", str(params), "--device", args.device]
    if args.compile_tier:
        command += ["--compile_tier", args.compile_tier]
    if args.command != "validate-only":
        command += ["--resume", "none"]
    if args.in_process:
        output, rc = _in_process(command)
    else:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        try:
            done = subprocess.run([args.cs_run, *command], capture_output=True, text=True, timeout=args.timeout,
                                  env=env)
            output, rc = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired:
            output, rc = f"timed out after {args.timeout} s", -1
    (folder / "output.txt").write_text(output)
    return {"file": name, "tag": tag, "params": str(params), "rc": rc, "first_error": first_error(output, rc)}


def _in_process(command: list[str]) -> tuple[str, int]:
    """``cs-run COMMAND`` in this process: its stdout and stderr, and its exit status."""
    import contextlib  # noqa: PLC0415 - only the in-process mode needs these
    import io  # noqa: PLC0415

    from cs_run.frontends.cli import cli  # noqa: PLC0415 - torch loads once, for every file

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            cli.main(args=command, prog_name="cs-run")
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception as e:  # noqa: BLE001 - a traceback is a finding, recorded as the file's result
            print(f"uncaught {type(e).__name__}: {e}")
            rc = 1
    return out.getvalue(), rc


def _kind(error: str) -> str:
    """An error without its file:line and values, to group files by cause."""
    error = re.sub(r" \(/[^)]*\)$", "", error)
    error = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", error)
    return error[:160]


def report(validated: list[str], trained: list[str]) -> str:
    """docs/modelzoo_sweep.md's tables from the --json files of a validate-only sweep (``validated``) and of its
    training run (``trained``): per tag the files, those new at that tag (blob ids not seen in an older tag),
    validate-only passes, refusals and the files trained; then each refusal with its error line."""
    runs = [json.loads(Path(f).read_text()) for f in validated]
    results = {r["blob"]: r for run in runs for r in run["results"]}
    per_tag = {tag: files for run in runs for tag, files in run["tags"].items()}
    train = {r["blob"]: r for f in trained for r in json.loads(Path(f).read_text())["results"]}
    lines = ["| tag | files | new | validate-only ok | refused | trained 5 steps (ok / run) |",
             "|---|---:|---:|---:|---:|---:|"]
    seen: set = set()
    for tag in sorted(per_tag, key=lambda t: [int(n) for n in re.findall(r"\d+", t)]):
        blobs = [blob for _, blob in per_tag[tag] if blob in results]  # all of them once every chunk ran
        ok = sum(results[b]["first_error"] == "ok" for b in blobs)
        ran = [train[b] for b in blobs if b in train]
        lines.append(f"| {tag} | {len(per_tag[tag])} | {len(set(blobs) - seen)} | {ok} | {len(blobs) - ok} | "
                     f"{sum(r['first_error'] == 'ok' for r in ran)} / {len(ran)} |")
        seen |= set(blobs)
    lines += ["", "| file (first tag) | tags | error |", "|---|---|---|"]
    for blob, r in results.items():
        if r["first_error"] != "ok":
            tags = [t for t in per_tag if blob in {b for _, b in per_tag[t]}]
            error = re.sub(r" \(/[^)]*\)$", "", r["first_error"]).replace("|", "\\|")
            error = error[:300] + ("..." if len(error) > 300 else "")
            lines.append(f"| {r['tag']}:{short_name(r['file'])} | {len(tags)} | {error} |")
    for r in train.values():
        if r["first_error"] != "ok":
            lines.append(f"| {r['tag']}:{short_name(r['file'])} (train) | | {r['first_error'][:300]} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The tool's options; :func:`default_args` and :func:`main` both read them, so a new option has one default."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tag", action="append", help="Model Zoo tag(s) (default Release_2.10.0)")
    parser.add_argument("--all-tags", action="store_true", help="every tag of the mirror (23), oldest first")
    parser.add_argument("--data-root", help="write each family's data under this folder and run every file on its "
                                            "family's (--shards is then not needed)")
    parser.add_argument("--ok-from", nargs="+", help="--json files of a validate-only sweep: run only the files "
                        "that passed there, the fewest that train every model, optimizer, schedule, precision and "
                        "input key and value of them (train_cover)")
    parser.add_argument("--every", action="store_true", help="with --ok-from: every file that passed, not the cover")
    parser.add_argument("--failed-from", nargs="+", help="--json files of a sweep: run only the files that failed "
                        "there (--report reads the later file's result of a file)")
    parser.add_argument("--first", type=int, default=0, help="skip the first N distinct files (to run in chunks)")
    parser.add_argument("--count", type=int, default=0, help="run only N distinct files (0: all)")
    parser.add_argument("--mirror", default=MIRROR)
    parser.add_argument("--shards", help="cs-run data preprocess output (train/ and val/)")
    parser.add_argument("--out", default="/tmp/modelzoo_files")
    parser.add_argument("--command", default="validate-only", choices=("validate-only", "train"))
    parser.add_argument("--device", default="CPU")
    parser.add_argument("--compile_tier", default=None, help="passed to cs-run (CSX: fx, inductor, auto)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--match", default="", help="only files whose path contains this")
    parser.add_argument("--cs_run", default=str(Path(sys.executable).with_name("cs-run")))
    parser.add_argument("--json", help="write every file's result here")
    parser.add_argument("--stub-model", action="store_true", help="replace the model by a stand-in (see above)")
    parser.add_argument("--name-from-folder", action="store_true",
                        help="give a file without model.name its family's name, as the vendor's run.py does")
    parser.add_argument("--in-process", action="store_true", help="run every file in this process, one at a time")
    parser.add_argument("--write-t5-text", action="store_true",
                        help="first write T5 text data (train/, val/, vocab.txt) to --shards (for --match t5/)")
    parser.add_argument("--write-transformer-text", action="store_true",
                        help="first write parallel text (train/, val/, vocab.txt) to --shards (for --match transformer/)")
    parser.add_argument("--write-bert-csv", action="store_true",
                        help="first write BERT CSV data (train/, val/, vocab.txt) to --shards (for --match bert/)")
    parser.add_argument("--write-llava-data", action="store_true",
                        help="first write llava samples and images (llava/start_N/train, val, images: the image at N, for "
                             "each image_start_idx of the files) under --shards (for --match llava/)")
    parser.add_argument("--llava-config", metavar="YAML",
                        help="with --write-llava-data: llava/start_1's samples from `cs-run data preprocess --config "
                             "YAML` (a llava preprocessing config; its image_dir's images copied) in place of random ones")
    parser.add_argument("--write-multimodal-simple-data", action="store_true",
                        help="first write multimodal_simple samples and images (multimodal_simple/train, val, images) "
                             "under --shards (for --match multimodal_simple/)")
    parser.add_argument("--write-dpr-data", action="store_true",
                        help="first write DPR HDF5 shards (train/, val/) to --shards (for --match dpr/)")
    parser.add_argument("--write-esm2-data", action="store_true",
                        help="first write ESM-2 HDF5 and CSV data (train/, val/) to --shards (for --match esm2/)")
    parser.add_argument("--write-dit-latents", action="store_true",
                        help="first write VAE latents (dit/latents*/train/, val/) to --shards (for --match dit/)")
    parser.add_argument("--write-images", action="store_true",
                        help="first write random images in the ImageNet layout to --shards (for --match dino/)")
    parser.add_argument("--report", nargs="+", metavar="JSON", help="print docs/modelzoo_sweep.md's tables from "
                        "these --json files of a validate-only sweep (and --trained's) and exit")
    parser.add_argument("--trained", nargs="*", default=[], metavar="JSON", help="--json files of its training run")
    return parser


def default_args(**overrides) -> argparse.Namespace:
    """The options of a run with no flags, then ``overrides`` (``shards=...``, ``command="train"``, ...): the one
    way the tests build the ``args`` of :func:`run_one` and :func:`shrunk_params`.

    Raises:
        TypeError: an override that is no option of the tool (a misspelt one would be ignored otherwise).
    """
    args = build_parser().parse_args([])
    unknown = sorted(set(overrides) - set(vars(args)))
    if unknown:
        raise TypeError(f"default_args: {', '.join(unknown)} is not an option of tools/modelzoo_files.py "
                        f"(options: {', '.join(sorted(vars(args)))})")
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.report:
        print(report(args.report, args.trained), end="")
        return 0
    if not (args.shards or args.data_root):
        parser.error("one of --shards or --data-root is required")
    for flag, kind in WRITE_FLAGS.items():
        if getattr(args, flag):
            if kind == "llava":
                write_llava_folders(Path(args.shards), args.llava_config, args.cs_run)
            else:
                DATA_WRITERS[kind](Path(args.shards))
    tags = all_tags(args.mirror) if args.all_tags else (args.tag or ["Release_2.10.0"])
    jobs, per_tag = sweep_jobs(tags, args.mirror, args.match)
    if args.failed_from:  # run again what failed there (after a fix)
        failed = {r["blob"] for f in args.failed_from for r in json.loads(Path(f).read_text())["results"]
                  if r["first_error"] != "ok"}
        jobs = [job for job in jobs if job[2] in failed]
    if args.ok_from:  # train only what validated, each train feature once (train_cover)
        passed = {r["blob"] for f in args.ok_from for r in json.loads(Path(f).read_text())["results"]
                  if r["first_error"] == "ok"}
        jobs = [job for job in jobs if job[2] in passed]
        jobs = jobs if args.every else train_cover(jobs, args)
    jobs = jobs[args.first:args.first + args.count if args.count else None]
    if args.data_root:
        write_data(Path(args.data_root), {DATA_OF[family_of(name)] for name, _, _ in jobs}, args.cs_run)
    if args.in_process:
        results = [run_one(name, tag, args) for name, tag, _ in jobs]
    else:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda job: run_one(job[0], job[1], args), jobs))
    for result, (_, _, blob) in zip(results, jobs):
        result["blob"] = blob
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "tags": per_tag}, indent=1))
    tally = collections.Counter(_kind(r["first_error"]) for r in results)
    for r in results:
        print(f"{r['tag']}:{short_name(r['file'])}: {r['first_error']}")
    print(f"\n{len(results)} distinct files of {sum(map(len, per_tag.values()))} in {len(tags)} tags; by first error:")
    for kind, count in tally.most_common():
        print(f"{count:4d}  {kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
