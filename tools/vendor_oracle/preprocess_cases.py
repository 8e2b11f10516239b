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
import gzip
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
    {"prompt": "A prompt with no completion", "completion": ""},  # skipped, counted as raw_docs_skipped
    {"prompt": "Hi", "completion": "Yo"},  # under min_sequence_len: dropped
]
# a record over max_seq_length (32): dropped where truncate_to_msl is not set
LONG_PROMPT = {"prompt": " ".join(TEXT_DOCS[:3]), "completion": "Too long to keep."}

CHATS = [
    {"messages": [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "What does the fox do?"},
                  {"role": "assistant", "content": "It jumps over the dog."},
                  {"role": "user", "content": " And the dog? "},
                  {"role": "assistant", "content": "The dog sleeps in the sun."}]},
    {"messages": [{"role": "user", "content": "Translate to French: good morning"},
                  {"role": "assistant", "content": "bonjour"}]},
    {"messages": [{"role": "user", "content": "An odd number of turns"}]},  # the hook drops it
    {"messages": [{"role": "user", "content": "No answer"}, {"role": "assistant", "content": ""}]},  # skipped
]

DPO = [
    {"prompt": "What does the fox do?", "chosen": "It jumps over the dog.", "rejected": "It sleeps."},
    {"prompt": " ".join(TEXT_DOCS[:2]), "chosen": "A fox, a dog and a wafer.", "rejected": "No idea."},  # truncated
    {"prompt": "Translate to French: good morning", "chosen": "bonjour", "rejected": "good morning"},
]
DPO_CHAT = [
    {"chosen": [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "Four."}],
     "rejected": [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "Five."}]},
    {"chosen": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi there."}],
     "rejected": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Go away."}]},
]

# NLG records as the vendor's NLGTokenGenerator reads them: already tokenized (E2E / DART / WebNLG style), a
# context and a completion list of token ids (ids of the tiny tokenizer, 0 is its <|endoftext|>); msl 16 holds them
NLG = [
    {"context": [45, 120, 7, 88, 230, 15], "completion": [301, 12, 99, 0]},
    {"context": [61], "completion": [17, 250, 0]},  # a one-token context: the vendor masks position 0 anyway
    {"context": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14], "completion": [200, 201, 202, 203, 204, 205, 0]},  # fills 16
    {"context": [77, 78, 79], "completion": [0]},  # a one-token completion
    {"context": [150, 151, 152, 153], "completion": [310, 311, 312, 313, 314, 0]},
]

# WikiText-103's tokenized style: what wikitext_detokenize undoes (number separators, spaced punctuation,
# brackets and quotes, heading marks, " 's", " N ", the degree sign)
WIKITEXT_DOCS = [
    " = = = Early life = = = \n The fox 's den was 1 @,@ 200 m wide ( about 3 @.@ 5 km from the river ) . \n",
    ' It was " quiet " , he said ; the dogs \' bowls held N bones at 20 \u00b0 C ! Really ? Yes : twice . ',
    " The wafer @-@ scale engine [ cores ] runs { many } models ' in parallel ' . = = Notes = = \n",
]

# LLaVA's conversation records (LLaVA-Instruct / LLaVA-Pretrain style: an image file name and "from"/"value"
# turns, "<image>" where the picture goes); the images are small PNGs written beside them (images/). One record
# names an image that is not there (the vendor skips it and counts it), one has no image (has_img False).
LLAVA_CHATS = [
    {"id": "0", "image": "red.png", "conversations": [
        {"from": "human", "value": "<image>\nWhat color is the picture?"},
        {"from": "gpt", "value": "It is red."}]},
    {"id": "1", "image": "blue.png", "conversations": [
        {"from": "human", "value": "Describe this.\n<image>"},
        {"from": "gpt", "value": "A blue square."},
        {"from": "human", "value": "Is it big?"},
        {"from": "gpt", "value": "No, it is small."}]},
    {"id": "2", "conversations": [
        {"from": "human", "value": "What does the fox do?"},
        {"from": "gpt", "value": "It jumps over the dog."}]},
    {"id": "3", "image": "missing.png", "conversations": [
        {"from": "human", "value": "<image>\nWhat is here?"},
        {"from": "gpt", "value": "Nothing."}]},
    {"id": "4", "image": "green.png", "conversations": [
        {"from": "system", "value": "You are terse."},
        {"from": "human", "value": "<image>"},
        {"from": "gpt", "value": "A green square in the sun."}]},
]
# phase 1 (image captions): every record has an image; the user's words are dropped, the caption is learned
LLAVA_CAPTIONS = [
    {"id": "0", "image": "red.png", "conversations": [
        {"from": "human", "value": "<image>\nRender a clear and concise summary of the photo."},
        {"from": "gpt", "value": "a red square on a plain background"}]},
    {"id": "1", "image": "blue.png", "conversations": [
        {"from": "human", "value": "Give a short caption.\n<image>"},
        {"from": "gpt", "value": "the blue one"}]},
    {"id": "2", "image": "missing.png", "conversations": [
        {"from": "human", "value": "<image>\nWhat is this?"},
        {"from": "gpt", "value": "a lost picture"}]},
    {"id": "3", "image": "green.png", "conversations": [
        {"from": "human", "value": "<image>"},
        {"from": "gpt", "value": "a green square in the sun"}]},
]
# an image in two user turns (the same file): two images, kept where max_num_img is 2, dropped where it is 1
LLAVA_TWO_IMAGES = {"id": "5", "image": "blue.png", "conversations": [
    {"from": "human", "value": "<image>\nWhat is this?"}, {"from": "gpt", "value": "A blue square."},
    {"from": "human", "value": "And now? <image>"}, {"from": "gpt", "value": "Still blue."}]}
LLAVA_IMAGES = {"red.png": (200, 30, 30), "blue.png": (30, 30, 200), "green.png": (30, 180, 60)}
"""the PNGs the llava records name (28 x 28, one colour and a white diagonal)"""

# what the tokenizer is trained on (every character the inputs use, so there are no unknown bytes)
_TRAIN_TEXT = TEXT_DOCS + [d["prompt"] + " " + d["completion"] for d in PROMPT_COMPLETION]
# (the llava records' words are not trained on: the tokenizer folder stays the one the other cases recorded with)

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|user|>", "<|assistant|>"]
FIM_TOKENS = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>"]
"""the FIM cases' tokenizer (the folder ``tokenizer_fim``) holds these as special tokens too"""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>' + message['content'] + eos_token }}"
    "{% endif %}{% endfor %}"
)

# Protein sequences for the esm2 (masked-LM) cases: one over max_seq_length (cut), one with letters outside
# the ESM vocabulary (a run of them is one <unk>), one with spaces between residues, and an empty one (skipped).
PROTEINS = [
    "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ",
    "MSLLTEVETPIRNEWGCRCNDSSDPLVVAASIIGILHLILWILDRLFFKCIYRRFKYGLKRGPSTEGVPESMREEYRKEQQSAVDADDGHFVSIELE",
    "GSHMLEDPVDAFQWTEKAL",
    "MADQLTEEQIAEFKEAFSLFDKDGDGTITTKELGTVMRSLGQNPTEAELQDMINEV",
    "MKVLAAGIVGLLLAQ jjz WQRSTAAX",
    "",
    "M K V L A A G I V G L L L A Q W Q R S T A",
    "PEPTIDEKRLVNMGTHYWCFSADQ",
    "MALWMRLLPLLALLALWGPDPAAAFVNQHLCGSHLVEALYLVCGERGFFYTPKT",
    "KKKKRRRRDDDDEEEE",
    "MTEYKLVVVGAGGVGKSALTIQLIQNHFVDEYDPTIEDSYRKQVVIDGETCLLDILDTAGQEEY",
    "MQIFVKTLTGKTITLEVEPSDTIENVKAKIQDKEGIPPDQQRLIFAGKQLEDGRTLSDYNIQKESTLHLVLRLRGG",
]

# The ESM-2 vocabulary in its order (facebook/esm2_*'s vocab.txt): what EsmTokenizer reads
ESM_VOCAB = ["<cls>", "<pad>", "<eos>", "<unk>", "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P", "K", "Q", "N",
             "F", "Y", "M", "H", "W", "C", "X", "B", "U", "Z", "O", ".", "-", "<null_1>", "<mask>"]

# (case id, vendor config file, input folder, {dotted key: value} overrides; "<IN>", "<OUT>", "<TOK>" are
# filled in with the input folder, the output folder and the tokenizer folder)
DELETE = "<DELETE>"
"""an override value: the key is removed from the vendor's config"""

CASES: list[tuple[str, str, str, dict]] = [
    ("hf_pretraining_packed", "hf_autoregressive_lm_preprocessing.yaml", "text", {
        "processing.max_seq_length": 16,
    }),
    ("hf_pretraining_unpacked", "hf_autoregressive_lm_preprocessing.yaml", "text", {
        "processing.max_seq_length": 16,
        "dataset.pack_sequences": False,
    }),
    ("hf_pretraining_short_seq", "hf_autoregressive_lm_preprocessing.yaml", "text", {
        "processing.max_seq_length": 16,
        "processing.short_seq_prob": 0.5,
        "processing.seed": 3,
    }),
    # a .txt and a .json.gz, read in 1 KiB chunks and written every 1 KiB: several files, chunks across files
    ("hf_pretraining_txt_gz_chunks", "hf_autoregressive_lm_preprocessing.yaml", "mixed", {
        "processing.max_seq_length": 16,
        "processing.read_chunk_size": 1,
        "processing.write_chunk_size": 1,
    }),
    # neoxtokenizer (a tokenizers JSON), sep_token null, truncate_to_msl set (no record needs it)
    ("summarization", "summarization_preprocessing.yaml", "prompt_completion", {
        "processing.max_seq_length": 32,
        "processing.tokenizer_params.encoder_file": "<TOK>/tokenizer.json",
        "processing.read_hook_kwargs": {"prompt_key": "prompt", "completion_key": "completion"},
    }),
    # gpt2tokenizer, sep_token "<SEP>", a record over max_seq_length dropped. The config's read_hook
    # (hooks:prompt_completion_key) is no function of the vendor's hooks module: its own tool stops on it.
    ("curation_corpus_summarization", "curation_corpus_summarization_preprocessing.yaml", "prompt_completion_long", {
        "processing.max_seq_length": 32,
        "processing.tokenizer_params.encoder_file": "<TOK>/encoder.json",
        "processing.tokenizer_params.vocab_file": "<TOK>/vocab.bpe",
        "processing.read_hook": "cerebras.modelzoo.data_preparation.data_preprocessing.hooks:"
                                "prompt_completion_text_read_hook",
    }),
    # inverted_mask: the loss mask flipped, in finetuning and in pretraining
    ("summarization_inverted_mask", "summarization_preprocessing.yaml", "prompt_completion", {
        "processing.max_seq_length": 32,
        "processing.inverted_mask": True,
        "processing.tokenizer_params.encoder_file": "<TOK>/tokenizer.json",
        "processing.read_hook_kwargs": {"prompt_key": "prompt", "completion_key": "completion"},
    }),
    ("hf_pretraining_inverted_mask", "hf_autoregressive_lm_preprocessing.yaml", "text", {
        "processing.max_seq_length": 16,
        "processing.inverted_mask": True,
    }),
    # multi-turn chat through the tokenizer folder's chat template; loss on the assistant's words and eos
    ("multi_turn_dialogue", "multi_turn_dialogue_preprocessing.yaml", "chat", {
        "processing.max_seq_length": 48,
    }),
    # prompt / chosen / rejected strings; a long prompt cut to max_prompt_length, then its answer
    ("dpo", "dpo_preprocessing.yaml", "dpo", {
        "processing.max_seq_length": 40,
        "dataset.max_prompt_length": 8,
        "processing.read_hook_kwargs": {"prompt_key": "prompt", "chosen_key": "chosen", "rejected_key": "rejected"},
    }),
    # chosen / rejected as chat lists (the first message is the prompt)
    ("dpo_chat_lists", "dpo_preprocessing.yaml", "dpo_chat", {
        "processing.max_seq_length": 40,
        "processing.read_hook_kwargs": {"chosen_key": "chosen", "rejected_key": "rejected"},
    }),
    # as shipped this config sets no training_objective: the vendor runs plain pretraining (its fim_* keys
    # unused) with neoxtokenizer and eos_id 0 (pad follows eos)
    ("fim_aug_as_shipped", "fim_aug_preprocessing.yaml", "text", {
        "processing.max_seq_length": 16,
        "processing.tokenizer_params.encoder_file": "<TOK>/tokenizer.json",
    }),
    ("hf_pretraining_parquet", "hf_autoregressive_lm_preprocessing.yaml", "parquet", {
        "processing.max_seq_length": 16,
    }),
    # training_objective fim: numpy's global RNG seeded with processing.seed draws per sample, per segment
    # between eos tokens (pad is eos here, so padding splits too); the tokenizer holds the FIM tokens
    ("fim_aug", "fim_aug_preprocessing.yaml", "text", {
        "processing.max_seq_length": 16,
        "processing.tokenizer_params.encoder_file": "<TOK>_fim/tokenizer.json",
        "dataset.training_objective": "fim",
    }),
    ("fim_aug_unpacked_seed", "fim_aug_preprocessing.yaml", "text", {
        "processing.max_seq_length": 16,
        "processing.seed": 5,
        "processing.tokenizer_params.encoder_file": "<TOK>_fim/tokenizer.json",
        "dataset.training_objective": "fim",
        "dataset.pack_sequences": False,
        "dataset.fim_rate": 0.6,
        "dataset.spm_rate": 0.3,
    }),
    # a Hugging Face folder (pad is not eos: padding is no segment break), several files, short_seq_prob too
    ("fim_hf_pad", "hf_autoregressive_lm_preprocessing.yaml", "mixed", {
        "processing.max_seq_length": 16,
        "processing.huggingface_tokenizer": "<TOK>_fim",
        "processing.short_seq_prob": 0.3,
        "processing.seed": 7,
        "dataset.training_objective": "fim",
        "dataset.pack_sequences": False,
        "dataset.fim_rate": 0.9,
        "dataset.spm_rate": 0.5,
        "dataset.fim_prefix_tok": "<fim_prefix>",
        "dataset.fim_middle_tok": "<fim_middle>",
        "dataset.fim_suffix_tok": "<fim_suffix>",
    }),
    # wikitext_detokenize on, as the config ships it (gpt2tokenizer)
    ("wikitext103", "wikitext103_lm_preprocessing.yaml", "wikitext", {
        "processing.max_seq_length": 16,
        "processing.tokenizer_params.encoder_file": "<TOK>/encoder.json",
        "processing.tokenizer_params.vocab_file": "<TOK>/vocab.bpe",
    }),
    # data splits: numpy's default_rng(split_seed) draws per record (a file name, the split, the context
    # length); each split is written under data_splits_dir and preprocessed into output_dir/SPLIT[/msl_N]
    ("finetuning_data_split", "finetuning_data_split.yaml", "many_pairs", {
        "setup.data_splits_dir": "<OUT>_splits",
        "processing.max_seq_length": 32,
        "processing.read_hook_kwargs": {"prompt_key": "prompt", "completion_key": "completion"},
    }),
    ("finetuning_context_split", "finetuning_context_split.yaml", "many_pairs", {
        "setup.data_splits_dir": "<OUT>_splits",
        "setup.context_splits": {"MSL_List": [24, "0.03125K", 40], "split_fractions": [0.5, 0.3, 0.2]},
        "processing.max_seq_length": 32,
        "processing.read_hook_kwargs": {"prompt_key": "prompt", "completion_key": "completion"},
    }),
    ("pretraining_data_context_split", "pretraining_data_context_split.yaml", "many_docs", {
        "setup.data_splits_dir": "<OUT>_splits",
        "setup.data_splits": {
            "train": {"split_fraction": 0.7, "context_splits": {"MSL_List": [16, 24], "split_fractions": [0.5, 0.5]}},
            "val": {"split_fraction": 0.3, "context_splits": {"MSL_List": [12, 20], "split_fractions": [0.4, 0.6]}},
        },
        "processing.max_seq_length": 16,
        "processing.split_seed": 4,
    }),
    # mode nlg (pre-tokenized context / completion lists, gpt2tokenizer for the ids only); the recorder supplies
    # the name the vendor's NLGTokenGenerator.encode misses (see record_preprocess.py)
    ("nlg", "nlg_preprocessing.yaml", "nlg", {
        "processing.max_seq_length": 16,
        "processing.tokenizer_params.encoder_file": "<TOK>/encoder.json",
        "processing.tokenizer_params.vocab_file": "<TOK>/vocab.bpe",
    }),
    ("gpt2_pretraining", "autoregressive_lm_preprocessing.yaml", "text", {
        "processing.max_seq_length": 16,
        "processing.tokenizer_params.encoder_file": "<TOK>/encoder.json",
        "processing.tokenizer_params.vocab_file": "<TOK>/vocab.bpe",
    }),
]

# processing.shuffle: each read chunk's samples dealt to output_chunk_<k>.h5 by numpy's RNG (seeded shuffle_seed),
# the packed rest too (re-seeded), then every file's rows permuted (seeded shuffle_seed + its place in the sorted list)
OPTION_CASES: list[tuple[str, str, str, dict]] = [
    ("hf_pretraining_shuffle", "hf_autoregressive_lm_preprocessing.yaml", "many_docs", {
        "processing.max_seq_length": 16,
        "processing.read_chunk_size": 1,
        "processing.write_chunk_size": 1,
        "processing.shuffle": True,
        "processing.shuffle_seed": 3,
    }),
    ("summarization_shuffle", "summarization_preprocessing.yaml", "many_pairs", {
        "processing.max_seq_length": 32,
        "processing.read_chunk_size": 1,
        "processing.write_chunk_size": 1,
        "processing.shuffle": True,
        "processing.tokenizer_params.encoder_file": "<TOK>/tokenizer.json",
        "processing.read_hook_kwargs": {"prompt_key": "prompt", "completion_key": "completion"},
    }),
    # the packed rest dealt after numpy is seeded again; .txt and .json.gz inputs (the latter counted 3 times its size)
    ("hf_pretraining_shuffle_rest", "hf_autoregressive_lm_preprocessing.yaml", "mixed", {
        "processing.max_seq_length": 16,
        "processing.read_chunk_size": 1,
        "processing.write_chunk_size": 1,
        "processing.shuffle": True,
        "processing.shuffle_seed": 2,
    }),
    # processing.token_limit: counted per read chunk (num_tokens); the chunk that reaches it is cut after the
    # record that reached it, and no later chunk is read (the packed rest is still written)
    ("hf_pretraining_token_limit", "hf_autoregressive_lm_preprocessing.yaml", "many_docs", {
        "processing.max_seq_length": 16,
        "processing.read_chunk_size": 1,
        "processing.token_limit": 700,
    }),
    ("summarization_token_limit", "summarization_preprocessing.yaml", "many_pairs", {
        "processing.max_seq_length": 32,
        "processing.read_chunk_size": 1,
        "processing.token_limit": 100,
        "processing.tokenizer_params.encoder_file": "<TOK>/tokenizer.json",
        "processing.read_hook_kwargs": {"prompt_key": "prompt", "completion_key": "completion"},
    }),
    # dataset.use_vsl: a read chunk's sequences packed into 5-row samples (input_ids, attention_mask, labels,
    # attention_span, position_ids)
    ("hf_pretraining_vsl", "hf_autoregressive_lm_preprocessing.yaml", "many_docs", {
        "processing.max_seq_length": 128,
        "processing.read_chunk_size": 1,
        "dataset.use_vsl": True,
    }),
    ("summarization_vsl", "summarization_preprocessing.yaml", "many_pairs", {
        "processing.max_seq_length": 32,
        "processing.read_chunk_size": 1,
        "dataset.use_vsl": True,
        "processing.tokenizer_params.encoder_file": "<TOK>/tokenizer.json",
        "processing.read_hook_kwargs": {"prompt_key": "prompt", "completion_key": "completion"},
    }),
    # chat records through the template, packed
    ("multi_turn_dialogue_vsl", "multi_turn_dialogue_preprocessing.yaml", "chat", {
        "processing.max_seq_length": 80,
        "dataset.use_vsl": True,
    }),
    # FIM draws from the same numpy RNG the shuffle seeds (and seeds again before the packed rest)
    ("fim_shuffle", "fim_aug_preprocessing.yaml", "many_docs", {
        "processing.max_seq_length": 16,
        "processing.read_chunk_size": 1,
        "processing.write_chunk_size": 1,
        "processing.shuffle": True,
        "processing.shuffle_seed": 5,
        "processing.tokenizer_params.encoder_file": "<TOK>_fim/tokenizer.json",
        "dataset.training_objective": "fim",
    }),
    # mode dpo: 6 rows per sample, 6 * max_seq_length tokens counted per record
    ("dpo_shuffle_token_limit", "dpo_preprocessing.yaml", "dpo", {
        "processing.max_seq_length": 40,
        "dataset.max_prompt_length": 8,
        "processing.read_hook_kwargs": {"prompt_key": "prompt", "chosen_key": "chosen", "rejected_key": "rejected"},
        "processing.shuffle": True,
        "processing.shuffle_seed": 1,
        "processing.token_limit": 250,
    }),
    # the three together
    ("hf_pretraining_vsl_shuffle_token_limit", "hf_autoregressive_lm_preprocessing.yaml", "many_docs", {
        "processing.max_seq_length": 128,
        "processing.read_chunk_size": 1,
        "processing.write_chunk_size": 1,
        "processing.shuffle": True,
        "processing.shuffle_seed": 11,
        "processing.token_limit": 1200,
        "dataset.use_vsl": True,
    }),
]
CASES += OPTION_CASES

# bert_pretraining: word pieces cut into max_seq_length pieces with token_type_ids, no masking (the vendor masks
# later, in the data processor); esm2: training_objective mlm, masked here with random.Random(seed) and numpy's
# global RNG (seeded with seed), through the slow EsmTokenizer the config names (a vocab.txt folder). The esm2
# config ships processes: 32; the cases run processes: 1, the layout cs-run writes.
CASES += [
    ("bert_pretraining", "bert_pretraining_config.yaml", "text", {
        "processing.max_seq_length": 16,
        "processing.huggingface_tokenizer": "<TOK>_bert",
    }),
    ("bert_pretraining_truncate", "bert_pretraining_config.yaml", "mixed", {
        "processing.max_seq_length": 12,
        "processing.huggingface_tokenizer": "<TOK>_bert",
        "processing.min_sequence_len": 4,
        "dataset.truncate_to_msl": True,
    }),
    ("esm2_mlm", "esm2_preprocessing_pre_training.yaml", "proteins", {
        "setup.processes": 1,
        "processing.max_seq_length": 32,
        "processing.huggingface_tokenizer": "<TOK>_esm",
    }),
    ("esm2_mlm_no_gather", "esm2_preprocessing_pre_training.yaml", "proteins", {
        "setup.processes": 1,
        "processing.max_seq_length": 24,
        "processing.seed": 3,
        "processing.huggingface_tokenizer": "<TOK>_esm",
        "dataset.mlm_with_gather": False,
        "dataset.mlm_fraction": 0.3,
        "dataset.ignore_index": -1,
    }),
    # wikitext_detokenize cleans the text before the masked-LM tokenization too
    ("esm2_mlm_wikitext", "esm2_preprocessing_pre_training.yaml", "wikitext", {
        "setup.processes": 1,
        "processing.max_seq_length": 40,
        "processing.huggingface_tokenizer": "<TOK>_esm",
        "processing.wikitext_detokenize": True,
    }),
]

# Multimodal finetuning (dataset.is_multimodal): each image turn becomes num_patches placeholder tokens (pad_id)
# where the image token was; data is N x 5 x msl (text_input_ids, loss_mask, labels, key_padding_mask,
# token_modality_idx) beside img_path, has_img and img_data_loc. The image token "<image>" is not in the tiny
# tokenizer: the vendor registers it as a special token (so vocab_size grows by one). Phase 1's shipped
# tokenizer is a custom class around the gated meta-llama/Meta-Llama-3-8B-Instruct; the case reads the local
# Hugging Face folder instead (processing.custom_tokenizer and tokenizer_params removed).
CASES += [
    ("llava_phase_2", "llava_phase_2_preproc.yaml", "llava", {
        "setup.image_dir": "<IN>/images",
        "processing.max_seq_length": 64,
        "dataset.num_patches": 4,
    }),
    ("llava_phase_1", "llava_phase_1_llama3.yaml", "llava_pretrain", {
        "setup.image_dir": "<IN>/images",
        "processing.custom_tokenizer": DELETE,
        "processing.tokenizer_params": DELETE,
        "processing.huggingface_tokenizer": "<TOK>",
        "processing.max_seq_length": 32,
        "dataset.num_patches": 4,
    }),
        # many records in two files, read and written in 1 KiB chunks and shuffled: the four datasets dealt and permuted
    # together; two images per sample at most (img_path and img_data_loc 2 wide)
    ("llava_phase_2_shuffle_chunks", "llava_phase_2_preproc.yaml", "llava_many", {
        "setup.image_dir": "<IN>/images",
        "processing.max_seq_length": 48,
        "processing.read_chunk_size": 1,
        "processing.write_chunk_size": 1,
        "processing.shuffle_seed": 3,
        "dataset.num_patches": 3,
        "dataset.max_num_img": 2,
    }),
    # unshuffled 1 KiB chunks (buffers of the four datasets written as they fill), the loss mask inverted, a
    # token limit (num_tokens: max_seq_length per sample)
    ("llava_phase_1_chunks", "llava_phase_1_llama3.yaml", "llava_many", {
        "setup.image_dir": "<IN>/images",
        "processing.custom_tokenizer": DELETE,
        "processing.tokenizer_params": DELETE,
        "processing.huggingface_tokenizer": "<TOK>",
        "processing.read_hook": "cerebras.modelzoo.data_preparation.data_preprocessing.hooks:finetuning_llava_hook",
        "processing.max_seq_length": 48,
        "processing.read_chunk_size": 1,
        "processing.write_chunk_size": 1,
        "processing.inverted_mask": True,
        "processing.token_limit": 500,
        "dataset.num_patches": 2,
    }),
    # its image token (<|image|>) differs from the records' (<image>, read_hook_kwargs); one placeholder per image
    ("mllama_phase_2", "mllama_preproc_using_llava_phase_2.yaml", "llava", {
        "setup.image_dir": "<IN>/images",
        "processing.max_seq_length": 48,
        "processing.write_chunk_size": 1024,
    }),
]

# The Release_2.10.0 configs no case above runs, and why (cs-run's --config refuses each with one line).
DEFERRED: dict[str, str] = {
    "llava_single_image_token.yaml": "no setup.mode, data, read hook or is_multimodal (the vendor's tool stops on the "
                                     "missing mode; cs-run refuses it with one line); with phase 2's added, the vendor "
                                     "fails on the recording tokenizer (its bos is its eos: the region search raises "
                                     "'offset mapping ... may be incorrect' and no sample is written): not recorded",
    "multimodal_pretraining_conceptual_captions.yaml": "multimodal pretraining (image captions) from a Hugging Face "
                                                       "hub dataset whose images are downloaded: refused by name",
}

# the keys every case sets (inputs, outputs, tokenizer, no ftfy)
_COMMON = {
    "setup.data.source": "<IN>",
    "setup.output_dir": "<OUT>",
    "processing.use_ftfy": False,
}


def build_tokenizer(folder: str, extra_special: tuple = ()) -> None:
    """Train a tiny byte-level BPE on the inputs' text and save it as a local Hugging Face folder.

    Deterministic for one `tokenizers` version; the recorder saves the folder next to the outputs and
    the tests read that copy, so both tools tokenize with the same files.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL_TOKENS + list(extra_special),
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
    # the same BPE as gpt2's two files (custom_tokenizer: gpt2tokenizer reads encoder.json + vocab.bpe)
    vocab_path, merges_path = tok.model.save(folder)
    os.replace(vocab_path, os.path.join(folder, "encoder.json"))
    os.replace(merges_path, os.path.join(folder, "vocab.bpe"))


def build_bert_tokenizer(folder: str) -> None:
    """A tiny lower-cased WordPiece (BERT's pipeline: normalizer, pre-tokenizer, [CLS] $A [SEP] with type ids),
    saved as a BertTokenizerFast folder. The vocabulary is built, not trained (tokenizers' WordPiece trainer
    orders it differently from run to run): the specials, every character alone and as ``##`` piece, and the
    words seen more than once, each set sorted; a word seen once is cut into pieces."""
    import re  # noqa: PLC0415

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = [w for text in _TRAIN_TEXT for w in re.findall(r"\w+|[^\w\s]", text.lower())]
    chars = sorted({c for w in words for c in w})
    twice = sorted({w for w in words if words.count(w) > 1 and len(w) > 1})
    vocab = {tok: i for i, tok in enumerate(special + chars + ["##" + c for c in chars] + twice)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    config = {"tokenizer_class": "BertTokenizerFast", "do_lower_case": True, "cls_token": "[CLS]",
              "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]", "unk_token": "[UNK]",
              "model_max_length": 512}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)


def build_esm_tokenizer(folder: str) -> None:
    """ESM-2's tokenizer folder as EsmTokenizer.save_pretrained writes it (vocab.txt, no tokenizer.json)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(ESM_VOCAB))
    special = {"cls_token": "<cls>", "eos_token": "<eos>", "mask_token": "<mask>", "pad_token": "<pad>",
               "unk_token": "<unk>"}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "EsmTokenizer", "model_max_length": 1026, **special}, f, indent=1)
    with open(os.path.join(folder, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=1)


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
    os.makedirs(os.path.join(folder, "chat"), exist_ok=True)
    with open(os.path.join(folder, "chat", "dialogues.jsonl"), "w") as f:
        for chat in CHATS:
            f.write(json.dumps(chat) + "\n")
    for name, records in (("dpo", DPO), ("dpo_chat", DPO_CHAT)):
        os.makedirs(os.path.join(folder, name), exist_ok=True)
        with open(os.path.join(folder, name, "pairs.jsonl"), "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    os.makedirs(os.path.join(folder, "parquet"), exist_ok=True)
    import pyarrow as pa  # noqa: PLC0415  (the recorder only: tests read the written file)
    import pyarrow.parquet as pq  # noqa: PLC0415

    pq.write_table(pa.table({"text": TEXT_DOCS[::-1], "n": list(range(len(TEXT_DOCS)))}),
                   os.path.join(folder, "parquet", "docs.parquet"))
    os.makedirs(os.path.join(folder, "prompt_completion_long"), exist_ok=True)
    with open(os.path.join(folder, "prompt_completion_long", "pairs.jsonl"), "w") as f:
        for pair in PROMPT_COMPLETION + [LONG_PROMPT]:
            f.write(json.dumps({"article_content": pair["prompt"], "summary": pair["completion"]}) + "\n")
    # many records in two files, so every split and context length gets some
    for name, records in (("many_docs", [{"text": f"{i}: {TEXT_DOCS[i % len(TEXT_DOCS)]}"} for i in range(40)]),
                          ("many_pairs", [PROMPT_COMPLETION[i % len(PROMPT_COMPLETION)] for i in range(40)])):
        os.makedirs(os.path.join(folder, name), exist_ok=True)
        for part in range(2):
            with open(os.path.join(folder, name, f"part{part}.jsonl"), "w") as f:
                for record in records[part::2]:
                    f.write(json.dumps(record) + "\n")
    os.makedirs(os.path.join(folder, "proteins"), exist_ok=True)
    with open(os.path.join(folder, "proteins", "sequences.jsonl"), "w") as f:
        for seq in PROTEINS:
            f.write(json.dumps({"text": seq}) + "\n")
    os.makedirs(os.path.join(folder, "nlg"), exist_ok=True)
    with open(os.path.join(folder, "nlg", "e2e.jsonl"), "w") as f:
        for record in NLG:
            f.write(json.dumps(record) + "\n")
    os.makedirs(os.path.join(folder, "wikitext"), exist_ok=True)
    with open(os.path.join(folder, "wikitext", "wiki.jsonl"), "w") as f:
        for doc in WIKITEXT_DOCS:
            f.write(json.dumps({"text": doc}) + "\n")
    many = [{**(LLAVA_CHATS + [LLAVA_TWO_IMAGES])[i % 6], "id": str(i)} for i in range(24)]
    for name, parts in (("llava", [LLAVA_CHATS]), ("llava_pretrain", [LLAVA_CAPTIONS]),
                        ("llava_many", [many[0::2], many[1::2]])):
        os.makedirs(os.path.join(folder, name, "images"), exist_ok=True)
        for i, records in enumerate(parts):
            with open(os.path.join(folder, name, "records.jsonl" if i == 0 else f"records{i}.jsonl"), "w") as f:
                for record in records:
                    f.write(json.dumps(record) + "\n")
        for image, colour in LLAVA_IMAGES.items():
            write_png(os.path.join(folder, name, "images", image), colour)
    os.makedirs(os.path.join(folder, "mixed"), exist_ok=True)
    with open(os.path.join(folder, "mixed", "a_lines.txt"), "w") as f:
        for i in range(12):  # about 1.1 KiB: more than one 1 KiB read chunk
            f.write(TEXT_DOCS[i % len(TEXT_DOCS)] + "\n")
    with gzip.open(os.path.join(folder, "mixed", "b_docs.json.gz"), "wt", encoding="utf-8") as f:
        for i, doc in enumerate(TEXT_DOCS):
            f.write(json.dumps({"text": doc, "id": i}) + "\n")


def write_png(path: str, colour: tuple[int, int, int], side: int = 28) -> None:
    """A small RGB PNG: one colour with a white diagonal (llava's records name these)."""
    from PIL import Image  # noqa: PLC0415  (the recorder and the tests that write images)

    image = Image.new("RGB", (side, side), colour)
    for i in range(side):
        image.putpixel((i, i), (255, 255, 255))
    image.save(path, format="PNG")


def _set(params: dict, dotted: str, value) -> None:
    *head, last = dotted.split(".")
    node = params
    for key in head:
        node = node.setdefault(key, {})
    if value == DELETE:
        node.pop(last, None)
    else:
        node[last] = value


def case_params(vendor_config: dict, input_name: str, overrides: dict, inputs: str, out: str, tok: str) -> dict:
    """The vendor's config with this case's keys set and the placeholders filled (a hub tokenizer name
    becomes the local folder)."""
    params = copy.deepcopy(vendor_config)
    common = dict(_COMMON)
    if "huggingface_tokenizer" in params.get("processing", {}) and "processing.huggingface_tokenizer" not in overrides:
        common["processing.huggingface_tokenizer"] = "<TOK>"
    fill = {"<IN>": f"{inputs}/{input_name}", "<OUT>": out, "<TOK>": tok}
    for dotted, value in {**common, **overrides}.items():
        if isinstance(value, str):
            for mark, path in fill.items():
                value = value.replace(mark, path)
        _set(params, dotted, value)
    return params
