"""Each decoder family is one ModelSpec whose config class is its ``model:`` schema: the params check reads
it (unknown key and wrong type by key path), its builder takes one config object and builds what the model
function builds, docs/models.md is generated from it, and architecture.md's 'to add' table names what exists."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from cs_run.errors import ParamsError
from cs_run.models.common.config import config_table, key
from cs_run.models.common.family import LM_DATA_PROCESSORS
from cs_run.models.common.keys_doc import models_markdown
from cs_run.registry import check_model_keys, get_model_spec, registered_models, resolve_object

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = [n for n in registered_models() if get_model_spec(n).data_processors == LM_DATA_PROCESSORS]  # the decoders
TINY = dict(num_hidden_layers=2, hidden_size=32, num_heads=4, filter_size=64, vocab_size=97, max_position_embeddings=32,
            rotary_dim=4, dropout_rate=0.0, attention_dropout_rate=0.0)
RELEASE = re.compile(r"^[12]\.\d+\.\d+$")


def test_every_decoder_family_has_a_config_class_and_builder():
    assert FAMILIES == sorted(["bloom", "btlm", "falcon", "gemma2", "gpt-neox", "gpt2", "gpt3", "gptj", "jais", "llama",
                               "mistral", "mixtral", "mpt", "santacoder", "starcoder"])
    for name in FAMILIES:
        spec = get_model_spec(name)
        cls = resolve_object(spec.config_class)
        assert dataclasses.is_dataclass(cls) and callable(resolve_object(spec.builder)), name
        assert spec.parallelize is None  # the slot: no family has a tensor-parallel plan yet
        for f in dataclasses.fields(cls):  # declared once: a release and a meaning for every key
            assert RELEASE.match(f.metadata["since"]) and f.metadata["doc"], (name, f.name)


@pytest.mark.parametrize("name", ["gpt2", "llama", "gptj", "gpt-neox", "falcon"])
def test_builder_of_config_object_is_the_model_function(name):
    spec = get_model_spec(name)
    keys = {**TINY, **({"position_embedding_type": "rotary"} if name == "llama" else {})}
    torch.manual_seed(0)
    by_keys = resolve_object(spec.model_fn)(**keys).eval()
    torch.manual_seed(0)
    by_config = resolve_object(spec.builder)(resolve_object(spec.config_class)(**keys)).eval()
    ids = torch.randint(0, 97, (2, 8))
    assert by_keys.config == by_config.config
    assert torch.equal(by_keys.model(ids), by_config.model(ids))


@pytest.mark.parametrize("default", [[224, 224], {"num_kv_groups": 2}])
def test_key_with_a_list_or_dict_default_gives_each_config_its_own_copy(default):
    """One ``key()`` serves every family: vision_transformer's list and dict defaults (image_size,
    extra_attention_params) are copied per config, so changing one config's value changes no other's."""
    cls = dataclasses.make_dataclass("C", [("value", type(default), key(default, "2.2.0", "a key"))])
    first, second = cls(), cls()
    assert first.value == second.value == default and first.value is not second.value
    first.value.clear()
    assert second.value == default and cls().value == default
    assert f"| `value` | `{type(default).__name__}` | `{default!r}` | 2.2.0 | a key |" in config_table(cls)


def test_gptj_config_resolves_its_two_names_of_a_key():
    """GPT-J's residual_dropout_rate is dropout_rate and attention_initializer is initializer (gptj_model.py)."""
    cls = resolve_object(get_model_spec("gptj").config_class)
    spec = {"name": "normal", "std": 0.3}
    decoder = cls(residual_dropout_rate=0.2, attention_initializer=spec).decoder_config()
    assert (decoder.dropout_rate, decoder.initializer, decoder.num_relative_attention_buckets) == (0.2, spec, 32)
    assert cls().decoder_config().dropout_rate == 0.1  # neither given: GPT-J's 0.1
    with pytest.raises(ValueError, match="residual_dropout_rate: dropout_rate names the same value"):
        cls(residual_dropout_rate=0.2, dropout_rate=0.3).decoder_config()


BAD_KEYS = [  # family, model keys, the error (the texts a function signature gave before)
    ("gptj", {"norm_first_sandwich": True}, "params: unknown key model.norm_first_sandwich; valid keys: "),
    ("falcon", {"embedding_layer_norm": True}, "params: unknown key model.embedding_layer_norm; did you mean "
                                               "'use_untied_layer_norm'?"),
    ("gpt2", {"residual_dropout_rate": 0.1}, "params: unknown key model.residual_dropout_rate; did you mean "
                                             "'dropout_rate'?"),
    ("llama", {"hiden_size": 8}, "params: unknown key model.hiden_size; did you mean 'hidden_size'?"),
    ("gpt2", {"hidden_size": "8"}, "params: model.hidden_size: expected an integer, got str '8'"),
    ("gpt-neox", {"position_embedding_type": "alibi"},
     "params: model.position_embedding_type: expected one of 'learned', 'fixed', 'relative', 'rotary', got str"),
    ("gpt-neox", {"pos_scaling_type": "llama3"}, "params: model.pos_scaling_type: expected one of 'linear', 'YaRN', "
                                                 "'yarn', 'longrope', got str 'llama3'"),
    ("mixtral", {"moe": [1]}, "params: model.moe: expected a mapping, got list"),
]


@pytest.mark.parametrize("name,keys,message", BAD_KEYS, ids=[f"{n}-{next(iter(k))}" for n, k, _ in BAD_KEYS])
def test_params_check_reads_the_config_class(name, keys, message):
    with pytest.raises(ParamsError) as e:
        check_model_keys(get_model_spec(name), keys, lambda key: f" ({key})")
    assert str(e.value).startswith(message) and str(e.value).endswith(f" (model.{next(iter(keys))})")


def test_models_doc_is_current():
    assert (ROOT / "docs" / "models.md").read_text() == models_markdown(), \
        "regenerate: python -m cs_run.models.common.keys_doc > docs/models.md"


def test_architecture_where_to_add_names_what_exists():
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| a ") and "`" in line]
    assert len(rows) >= 4
    names = [n for row in rows for n in re.findall(r"`([^`]+)`", row)]
    for path in (n for n in names if n.endswith((".py", ".md"))):
        assert (ROOT / path.replace("<family>", "gptj")).exists(), path
    spec = get_model_spec("gptj")
    for attr in (n.split(".", 1)[1] for n in names if n.startswith("ModelSpec.")):
        assert hasattr(spec, attr), attr
    family = resolve_object("cs_run.models.common.family:register_decoder_family")
    assert "model" in family.__code__.co_varnames and "hf_converter" in family.__code__.co_varnames
    for name in ("cs_run.models.common.config:key", "cs_run.models.common.hf:HFAdapter",
                 "cs_run.models.gptj.model:build_model"):
        resolve_object(name)
