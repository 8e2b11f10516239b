"""The `data preprocess --config` cases the oracle records and the tests replay, importable from both venvs.

Nothing here imports the vendor package or cs-run: the recorder (run in the vendor's venv, see
record_preprocess.py) and tests/data/test_vendor_preprocess.py (run in cs-run's) both read this table,
so a case means the same config on both sides. Each case names one of the Model Zoo's Release_2.10.0
preprocessing configs and the keys the recorder changes in it: the input folder, the output folder and
the tokenizer point at small local files, and `max_seq_length` is small so a few lines make several
sequences. `use_ftfy` is turned off (ftfy is not a cs-run dependency; with it installed the same path runs).
"""

from __future__ import annotations

import copy
import json
import os

# the configs' folder in the Model Zoo source
CONFIG_DIR = "src/cerebras/modelzoo/data_preparation/data_preprocessing/configs"

# A few short documents: long enough to span several 16-token sequences, and one under
# min_sequence_len (10 tokens), which the vendor drops.
TEXT_DOCS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun all day long.",
    "Cerebras builds wafer scale engines; each one holds many cores that run the model in parallel.",
    "short one",
    "A tokenizer splits text into pieces, and the model learns to predict the next piece of text.",
    "Packing joins documents end to end so that no slot of the sequence is wasted on padding.",
]

PROMPT_COMPLETION = [
    {"prompt": "Summarize: the fox jumps over the dog.", "completion": "A fox jumps."},
    {"prompt": "Translate to French: good morning", "completion": "bonjour"},
    {"prompt": "What is two plus two?", "completion": "Four, which is the sum of two and two."},
]

# what the tokenizer is trained on (every character the inputs use, so there are no unknown bytes)
_TRAIN_TEXT = TEXT_DOCS + [d["prompt"] + " " + d["completion"] for d in PROMPT_COMPLETION]

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|user|>", "<|assistant|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '<|user|>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>' + message['content'] + eos_token }}"
    "{% endif %}{% endfor %}"
)

# (case id, vendor config file, {dotted key: value} overrides; "<IN>", "<OUT>", "<TOK>" are filled in)
CASES: list[tuple[str, str, dict]] = [
    ("hf_pretraining_packed", "hf_autoregressive_lm_preprocessing.yaml", {
        "processing.max_seq_length": 16,
    }),
    ("hf_pretraining_unpacked", "hf_autoregressive_lm_preprocessing.yaml", {
        "processing.max_seq_length": 16,
        "dataset.pack_sequences": False,
    }),
]

# the keys every case sets (inputs, outputs, tokenizer, no ftfy)
_COMMON = {
    "setup.data.source": "<IN>",
    "setup.output_dir": "<OUT>",
    "processing.huggingface_tokenizer": "<TOK>",
    "processing.use_ftfy": False,
}


def build_tokenizer(folder: str) -> None:
    """Train a tiny byte-level BPE on the inputs' text and save it as a local Hugging Face folder.

    Deterministic for one `tokenizers` version; the recorder saves the folder next to the outputs and
    the tests read that copy, so both tools tokenize with the same files.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_TRAIN_TEXT, trainer=trainer)
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "bos_token": "<|endoftext|>",
        "pad_token": "<|pad|>",
        "model_max_length": 1024,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)


def write_inputs(folder: str) -> None:
    """Write each input kind the cases read: text documents and prompt/completion pairs as .jsonl."""
    os.makedirs(os.path.join(folder, "text"), exist_ok=True)
    os.makedirs(os.path.join(folder, "prompt_completion"), exist_ok=True)
    with open(os.path.join(folder, "text", "docs.jsonl"), "w") as f:
        for doc in TEXT_DOCS:
            f.write(json.dumps({"text": doc}) + "\n")
    with open(os.path.join(folder, "prompt_completion", "pairs.jsonl"), "w") as f:
        for pair in PROMPT_COMPLETION:
            f.write(json.dumps(pair) + "\n")


def case_input(case_id: str) -> str:
    """The input subfolder a case reads."""
    return "prompt_completion" if "finetuning" in case_id else "text"


def _set(params: dict, dotted: str, value) -> None:
    *head, last = dotted.split(".")
    node = params
    for key in head:
        node = node.setdefault(key, {})
    node[last] = value


def case_params(vendor_config: dict, case_id: str, overrides: dict, inputs: str, out: str, tok: str) -> dict:
    """The vendor's config with this case's keys set and the placeholders filled."""
    params = copy.deepcopy(vendor_config)
    fill = {"<IN>": os.path.join(inputs, case_input(case_id)), "<OUT>": out, "<TOK>": tok}
    for dotted, value in {**_COMMON, **overrides}.items():
        _set(params, dotted, fill.get(value, value) if isinstance(value, str) else value)
    return params
