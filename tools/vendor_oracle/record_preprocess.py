"""Record the vendor's `data_preprocess` outputs on small local inputs as golden files.

Run by a developer in a separate venv that can run the Model Zoo's Release_2.10.0 preprocessing on CPU
(never in CI, never a dependency of cs-run)::

    git --git-dir=MODELZOO_GIT archive Release_2.10.0 src | tar -x -C /tmp/mzsrc
    python3.11 -m venv /tmp/mzprep && /tmp/mzprep/bin/pip install datasets pydantic rich psutil \\
        pyarrow zstandard h5py numpy tokenizers pillow pyyaml tqdm jsonschema pandas ftfy jinja2 \\
        transformers==4.57.1 tokenizers==0.22.1 datasets==3.6.0 h5py==3.13.0 pydantic==2.8.2 "numpy<2"
    /tmp/mzprep/bin/python tools/vendor_oracle/record_preprocess.py /tmp/mzsrc tests/data/vendor_preprocess

It writes the inputs, a tiny tokenizer folder, and for each case of preprocess_cases.CASES the config it
ran (placeholders `<IN>`/`<OUT>`/`<TOK>` in place of this machine's paths), the vendor's .h5 files and its
data_params.json. tests/data/test_vendor_preprocess.py runs cs-run on the same config and compares.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import preprocess_cases as pc  # noqa: E402

# Release_2.10.0's utils.get_tokenizer_vocab (read by training_objective: fim only) imports
# cerebras.modelzoo.data_preparation.nlp.tokenizers.{BPETokenizer,HFTokenizer}, which that release does not ship:
# its own tool stops there on every FIM config. The recorder puts two empty classes under those names (nothing
# is an instance of them, so the function goes on to its PreTrainedTokenizerFast branch, the one a neox or
# Hugging Face tokenizer takes) and runs the tool's __main__ otherwise unchanged.
#
# Release_2.10.0's NLGTokenGenerator.encode (mode nlg) ends its stats with ``"n_examples": successful``, a name
# nothing defines (its module has no global of it, the method no local): every record raises NameError, so the
# shipped nlg config writes no sample. The recorder defines the module global ``successful = 1`` before the tool
# runs. That is the value the code means: the same dict's "successful_files" is files_processed - discarded_files,
# which is 1 for every record (the stacked sample is 3 x max_seq_length, never empty, so discarded_files stays 0),
# and every other token generator counts n_examples 1 per sample (utils.py's stats["n_examples"] = 1). Nothing
# else in the tool is changed.
_RUN_VENDOR = """
import runpy, sys, types
for name in ("BPETokenizer", "HFTokenizer"):
    module = types.ModuleType("cerebras.modelzoo.data_preparation.nlp.tokenizers." + name)
    setattr(module, name, type(name, (), {}))
    sys.modules[module.__name__] = module
import cerebras.modelzoo.data_preparation.data_preprocessing.nlg_token_generator as nlg
nlg.successful = 1
sys.argv = ["preprocess_data", "--config", sys.argv[1]]
runpy.run_module("cerebras.modelzoo.data_preparation.data_preprocessing.preprocess_data", run_name="__main__")
"""


def _run_vendor(mzsrc: str, params: dict, work: str) -> None:
    config = os.path.join(work, "config.yaml")
    with open(config, "w") as f:
        yaml.safe_dump(params, f)
    env = dict(os.environ, PYTHONPATH=os.path.join(mzsrc, "src"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    cmd = [sys.executable, "-c", _RUN_VENDOR, config]
    subprocess.run(cmd, check=True, env=env, cwd=work)


def main(mzsrc: str, out_root: str) -> None:
    inputs = os.path.join(out_root, "inputs")
    tok = os.path.join(out_root, "tokenizer")
    pc.write_inputs(inputs)
    pc.build_tokenizer(tok)
    pc.build_tokenizer(tok + "_fim", tuple(pc.FIM_TOKENS))
    pc.build_bert_tokenizer(tok + "_bert")
    pc.build_esm_tokenizer(tok + "_esm")
    only = set(sys.argv[3:])
    for case_id, config_name, input_name, overrides in pc.CASES:
        if only and case_id not in only:
            continue
        with open(os.path.join(mzsrc, pc.CONFIG_DIR, config_name)) as f:
            vendor_config = yaml.safe_load(f)
        case_dir = os.path.join(out_root, case_id)
        shutil.rmtree(case_dir, ignore_errors=True)
        os.makedirs(case_dir)
        with open(os.path.join(case_dir, "config.yaml"), "w") as f:  # the test fills the placeholders
            yaml.safe_dump(pc.case_params(vendor_config, input_name, overrides, "<IN>", "<OUT>", "<TOK>"), f)
        with tempfile.TemporaryDirectory() as work:
            out = os.path.join(work, "out")
            params = pc.case_params(vendor_config, input_name, overrides, os.path.abspath(inputs), out,
                                    os.path.abspath(tok))
            _run_vendor(mzsrc, params, work)
            found = glob.glob(os.path.join(out, "**", "*.h5"), recursive=True)
            found += glob.glob(os.path.join(out, "**", "data_params.json"), recursive=True)
            for path in sorted(found):  # a data split's outputs are in subfolders (SPLIT/msl_N)
                rel = os.path.relpath(path, out)
                os.makedirs(os.path.dirname(os.path.join(case_dir, rel)), exist_ok=True)
                shutil.copy(path, os.path.join(case_dir, rel))
            shutil.copytree(out + "_splits", os.path.join(case_dir, "splits"), dirs_exist_ok=True) \
                if os.path.isdir(out + "_splits") else None
        print(f"{case_id}: {sorted(os.listdir(case_dir))}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
