"""The params files of every Model Zoo release (read from the local mirror of github:Cerebras/modelzoo, never
copied here; skipped without it), as tools/modelzoo_files.py shrinks them: the keys older releases' own code read,
each row of FIXED stopped at its key before its fix (tools/modelzoo_files.py's sweep, docs/modelzoo_sweep.md);
the refusals, one error line naming the key; and, marked ``sweep``, every distinct file of every tag through
validate-only, checked against the table of docs/modelzoo_sweep.md."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import yaml
from modelzoo_file_helpers import mz, needs_mirror

from cs_run.errors import ParamsError
from cs_run.models.bert.model import BertConfig
from cs_run.models.bert.model import build as build_bert
from cs_run.models.common.norms import get_norm
from cs_run.models.t5.config import T5Config
from cs_run.models.t5.model import build as build_t5
from cs_run.params import load_params
from cs_run.resolve import model_function, resolve_params

OLD = "modelzoo/transformers/pytorch/"
NEW = "src/cerebras/modelzoo/models/"

FIXED = [  # (tag, file, what stopped it before the fix)
    ("R_1.6.0", OLD + "t5/configs/t5_base.yaml", "model.use_t5_layer_norm"),
    ("R_1.6.0", OLD + "transformer/configs/transformer_base.yaml", "model.use_t5_layer_norm"),
    ("Release_2.0.2", OLD + "transformer/configs/transformer_large.yaml", "src_max_position_embeddings from the input"),
    ("R_1.7.0", OLD + "t5/configs/t5_small.yaml", "model.enable_vts (t5)"),
    ("R_1.6.0", OLD + "bert/configs/bert_base_msl128.yaml", "model.enable_vts (bert)"),
    ("Release_1.8.0", OLD + "bert/configs/bert_large_MSL512_ws.yaml", "model.precision_opt_level (bert)"),
    ("Release_2.4.0", NEW + "nlp/bert/configs/bert_large_MSL10k_preview.yaml", "bert's BertCSVDataProcessor"),
    ("Release_2.3.1", NEW + "vision/vision_transformer/configs/params_vit_base_patch_16_imagenet_1k.yaml",
     "train_input.patch_size"),
    ("Release_2.3.1", NEW + "nlp/gemma2/configs/params_gemma2_27b_msl8k.yaml", "train_input.num_examples"),
    ("R_1.6.0", OLD + "bert/fine_tuning/classifier/configs/bert_base_classifier_sst2.yaml", "head named bert by its folder"),
    ("Release_1.8.0", OLD + "bert/fine_tuning/token_classifier/configs/bert_base_ner_bc5cdr_chem.yaml",
     "label_vocab_file from the input"),
    ("Release_2.2.0", NEW + "nlp/dpo/configs/params_zephyr_7b_dpo.yaml", "model.fp16_type of the flat dpo form"),
    ("Release_2.2.0", NEW + "nlp/dpr/configs/params_dpr_base_nq.yaml", "model.scale_similarity"),
    ("Release_2.3.0", NEW + "nlp/dpr/configs/params_dpr_base_nq.yaml", "q_encoder.fp16_type"),
    ("Release_2.4.0", NEW + "multimodal/multimodal_simple/configs/params_mm_llava_llama2_7b_phase1.yaml",
     "train_input.bos_token_id of multimodal_simple"),
    ("Release_2.3.0", NEW + "multimodal/multimodal_simple/configs/params_mm_llava_llama2_7b_phase1_v2.yaml",
     "image_models[0].image_model: [encoder, projection] of 2.3"),
]

REFUSED = [  # (tag, file, the error line's words): not built here, refused by name
    ("R_1.6.0", OLD + "bert/fine_tuning/qa/configs/bert_base_squad.yaml", "unknown model 'bert/qa'"),
    ("R_1.7.0", OLD + "bert/fine_tuning/qa/configs/bert_base_squad.yaml", "unknown key predict_input"),
    ("Release_2.3.0", NEW + "nlp/esm2/classification/configs/params_esm2_650M_UR50_classifier.yaml",
     "unknown model 'esm2/classification'"),
    ("Release_2.0.2", OLD + "gpt3/configs/sparsity/pretraining/params_gpt3_125m_rigl75.yaml", "sparsity.schedule"),
    ("R_1.7.0", OLD + "gpt3/configs/params_gpt3_20b.yaml", "is given twice"),
    ("Release_2.2.0", NEW + "nlp/dpr/embedding_generation/configs/dpr_base_embed.yaml",
     "'DPREmbedGenHDF5DataProcessor' is not built here: Release 2.2's DPR embedding generation"),
    ("Release_2.2.0", NEW + "nlp/dpr/embedding_generation/configs/dpr_nano_embed_synthetic.yaml",
     "'DPREmbedGenSyntheticDataProcessor' is not built here: Release 2.2's DPR embedding generation"),
]


def _args(data_root: Path, **more):
    return mz.default_args(name_from_folder=True, data_root=str(data_root), **more)


def _check(tag: str, name: str, tmp_path: Path) -> None:
    """What validate-only does before it traces, on the file's tiny copy: load_params, resolve_params and the
    model built from its keys (as runners/_build.py builds it)."""
    if mz.family_of(name) == "bert":
        mz.write_bert_csv(tmp_path / "bert")  # the token classifier's model reads its label2id.json
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(mz.shrunk_params(name, tag, _args(tmp_path), tmp_path / "model_dir")))
    params = load_params(path)
    resolve_params(params)
    try:
        model_function(params)(**params.model.extra)
    except ValueError as e:
        raise ParamsError(f"params: model: {e}") from e


@needs_mirror
@pytest.mark.parametrize(("tag", "name", "fixed"), FIXED, ids=[f"{t}:{Path(n).stem}" for t, n, _ in FIXED])
def test_a_file_of_an_older_release_passes_its_keys(tag, name, fixed, tmp_path):
    _check(tag, name, tmp_path)


@needs_mirror
@pytest.mark.parametrize(("tag", "name", "words"), REFUSED, ids=[f"{t}:{Path(n).stem}" for t, n, _ in REFUSED])
def test_a_file_not_built_here_is_one_error_naming_it(tag, name, words, tmp_path):
    with pytest.raises(ParamsError) as e:
        _check(tag, name, tmp_path)
    assert words in str(e.value) and "\n" not in str(e.value).strip()


def test_the_tools_args_are_its_parsers_defaults_and_a_misspelt_option_is_an_error(tmp_path):
    args = mz.default_args(shards=str(tmp_path))
    assert vars(args) == {**vars(mz.build_parser().parse_args([])), "shards": str(tmp_path)}
    assert mz.shards_of(NEW + "nlp/dpr/configs/params_dpr_base_nq.yaml", args) == tmp_path  # no --data-root
    with pytest.raises(TypeError, match="shard is not an option"):
        mz.default_args(shard=str(tmp_path))


@pytest.mark.parametrize(("flag", "norm"), [(None, "rmsnorm"), (True, "rmsnorm"), (False, "layernorm")])
def test_use_t5_layer_norm_picks_the_norm_as_releases_1_6_to_1_9(flag, norm):
    """R_1.6-1.9 t5/model.py: RMSNorm (T5LayerNorm) if use_t5_layer_norm (default true) else nn.LayerNorm."""
    model = build_t5(T5Config(d_model=16, d_kv=4, d_ff=32, num_heads=4, encoder_num_hidden_layers=1,
                              src_vocab_size=32, use_t5_layer_norm=flag))
    norms = [m for m in model.modules() if type(m) in (get_norm("rmsnorm"), get_norm("layernorm"))]
    assert len(norms) == 7 and all(type(m) is get_norm(norm) for m in norms)  # 2 + 3 per layer, 2 finals


def test_use_t5_layer_norm_against_norm_type_is_refused():
    with pytest.raises(ValueError, match="use_t5_layer_norm: true asks for rmsnorm and norm_type is layernorm"):
        T5Config(use_t5_layer_norm=True, norm_type="layernorm")


def test_bert_hardware_keys_of_old_releases_are_noted_and_change_nothing(caplog):
    """enable_vts (cbtorch StripPadding) and precision_opt_level steered Cerebras hardware only."""
    keys = dict(vocab_size=64, hidden_size=16, num_heads=2, filter_size=32, num_hidden_layers=1,
                max_position_embeddings=16, dropout_rate=0.0)
    batch = {"input_ids": torch.randint(5, 64, (2, 16)), "attention_mask": torch.ones(2, 16, dtype=torch.long),
             "token_type_ids": torch.zeros(2, 16, dtype=torch.long), "labels": torch.randint(5, 64, (2, 3)),
             "masked_lm_positions": torch.tensor([[1, 4, 7]] * 2), "masked_lm_mask": torch.ones(2, 3),
             "next_sentence_label": torch.tensor([0, 1])}
    losses = []
    for extra in ({}, {"enable_vts": True, "precision_opt_level": 1}):
        torch.manual_seed(0)
        with caplog.at_level(logging.INFO):
            losses.append(build_bert(BertConfig(**keys, **extra))(batch))
    assert torch.equal(*losses)
    assert {f"model.{k}: a Cerebras hardware option; same math here" for k in ("enable_vts", "precision_opt_level")} \
        <= {r.getMessage() for r in caplog.records}


# --- the sweep: every distinct file of every tag through validate-only (make test-sweep) ---

_RESULTS: dict = {}
"""blob id -> first error, shared by the tags (byte-identical files run once); ``first``: blob id -> the file and
tag it first appears in."""


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("modelzoo_data")


def _expected(name: str, tag: str) -> str:
    """The words of a file's refusal in tools/modelzoo_files.py's SWEEP_REFUSALS (alternatives split by
    `` | ``), by the tag the file first appears in, or ok."""
    return mz.SWEEP_REFUSALS.get(f"{tag}:{mz.short_name(name)}", "ok")


@needs_mirror
@pytest.mark.sweep
@pytest.mark.parametrize("tag", mz.all_tags() if Path(mz.MIRROR).exists() else [])
def test_every_file_of_a_tag_passes_validate_only_or_is_refused_by_name(tag, data_root, tmp_path):
    if not _RESULTS:
        _RESULTS["first"] = {blob: (name, first) for name, first, blob in mz.sweep_jobs(mz.all_tags())[0]}
    first = _RESULTS["first"]
    jobs, per_tag = mz.sweep_jobs([tag])
    args = _args(data_root, out=str(tmp_path), in_process=True)  # validate-only on CPU, the tool's defaults
    todo = [job for job in jobs if job[2] not in _RESULTS]
    mz.write_data(data_root, {mz.DATA_OF[mz.family_of(name)] for name, _, _ in todo}, args.cs_run)
    for name, _, blob in todo:
        _RESULTS[blob] = mz.run_one(name, tag, args)["first_error"]
    wrong = {}
    for name, blob in per_tag[tag]:
        expected = _expected(*first[blob])
        if not (_RESULTS[blob] == "ok" if expected == "ok" else
                any(words in _RESULTS[blob] for words in expected.split(" | "))):
            wrong[name] = _RESULTS[blob]
    assert not wrong, wrong
