"""Every command's --help: a default (or where the value comes from) for every option, sections, an Examples
block whose commands parse, and both spellings (--a_b, --a-b) of every flag giving the same value."""

from __future__ import annotations

import shlex
from importlib import resources

import click
import pytest
import yaml
from click.testing import CliRunner

from cs_run import registry
from cs_run.frontends.cli import SUBSYSTEMS, cli
from cs_run.frontends.flags import COMMAND_USES, run_options


def invoke(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def _commands(group=cli, path=()):
    """(path, command) of every leaf command, the lazily loaded subsystems included."""
    for name in group.list_commands(None):
        command = group.get_command(None, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = dict(_commands())
OPTIONS = [(path, param) for path, command in COMMANDS.items() for param in command.params
           if isinstance(param, click.Option) and param.name != "help"]
EXAMPLED = [*COMMAND_USES, "checkpoint convert", "checkpoint info", "data preprocess", "init", "plot", "generate",
            "lm-eval"]


def test_the_walk_sees_every_command():
    assert {" ".join(path) for path in COMMANDS} == {*COMMAND_USES, "init", "exec", "plot", "checkpoint convert",
                                                      "checkpoint info", "data preprocess", "generate", "lm-eval"}
    assert set(SUBSYSTEMS) <= {path[0] for path in COMMANDS}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder holding what the examples and the table name as existing inputs: a params file (the bundled
    fc_mnist params), checkpoint files, model_dirs and a tokenizer."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_bytes((resources.files("cs_run.examples") / "fc_mnist" / "params.yaml").read_bytes())
    for name in ("model_dir/fc_mnist/checkpoint_100.mdl", "model_dir/fc_mnist/checkpoint_50.mdl", "tokenizer.json",
                 "checkpoint_100.mdl", "whole.mdl", "x.file"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    for name in ("model_dir/csx", "model_dir/checkpoint_30.mdl", "hf_llama", "x.dir"):
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
    return tmp_path


def _parse(path: tuple[str, ...], args: list[str]) -> dict:
    """The values cs-run's parser gives ``cs-run PATH ARGS`` (no command runs)."""
    parent, group = click.Context(cli, info_name="cs-run"), cli
    for name in path[:-1]:
        group = group.get_command(parent, name)
        parent = click.Context(group, info_name=name, parent=parent)
    return COMMANDS[path].make_context(path[-1], list(args), parent=parent).params


def _arguments(command: click.Command, but: click.Option) -> list[str]:
    """Values for the command's required arguments and options other than ``but`` (names the workdir holds)."""
    out = []
    for param in command.params:
        if isinstance(param, click.Argument) and param.required:
            out.append("x.dir" if isinstance(param.type, click.Path) and not param.type.file_okay else "x.file")
        elif isinstance(param, click.Option) and param.required and param is not but:
            out += [param.opts[0], "out"]
    return out


def _value(param: click.Option) -> list[str]:
    """A value the option takes that differs from its default."""
    if param.is_flag:
        return []
    kind = param.type
    if isinstance(kind, click.Choice):
        return [next(c for c in kind.choices if c != param.default)]
    if isinstance(kind, click.FloatRange):
        return ["0.5"]
    if isinstance(kind, click.IntRange):
        return [str((kind.min or 0) + 3)]
    if isinstance(kind, click.types.IntParamType):
        return ["3"]
    if isinstance(kind, click.Path):
        return ["x.dir" if not kind.file_okay else "x.file"]
    return ["a=b"]


SPELLED = [(path, param) for path, param in OPTIONS if any("_" in opt for opt in param.opts)]


def test_the_table_holds_the_multi_word_flags():
    names = {(" ".join(path), opt) for path, param in SPELLED for opt in param.opts if opt.startswith("--")}
    assert {("train", "--max_steps"), ("train", "--print_config"), ("checkpoint convert", "--no_verify"),
            ("data preprocess", "--max_seq_length"), ("eval", "--max_wgt_servers")} <= names
    assert len(SPELLED) > 90  # 6 run commands x ~15 flags, and the others'


@pytest.mark.parametrize("path, param", SPELLED, ids=lambda x: " ".join(x) if isinstance(x, tuple) else x.opts[-1])
def test_every_flag_parses_in_both_spellings_to_the_same_value(path, param, workdir):
    """--a_b, --a-b and --a-b=VALUE set the same value, which is the one given (not the default)."""
    flag = next(opt for opt in param.opts if opt.startswith("--") and "_" in opt)
    required = _arguments(COMMANDS[path], but=param)
    value = _value(param)
    given = _parse(path, [*required, flag, *value])[param.name]
    assert param.required or given != _parse(path, required)[param.name]
    assert _parse(path, [*required, flag.replace("_", "-"), *value])[param.name] == given
    if value:
        assert _parse(path, [*required, f"{flag.replace('_', '-')}={value[0]}"])[param.name] == given


@pytest.mark.parametrize("args, message", [
    (["train", "--max_steps", "0"], "Invalid value for '--max_steps': 0 is not in the range x>=1."),
    (["train", "--max_steps"], "Option '--max_steps' requires an argument."),
    (["train", "--compile_tier", "fast"], "Invalid value for '--compile_tier': 'fast' is not one of 'auto', 'fx', "
                                          "'inductor'."),
    (["eval", "--num_epochs", "3"], "--num_epochs does not apply to 'cli eval'; the commands that take it: train, "
                                    "train-and-eval"),
    (["train", "--max_stesp", "3"], "No such option '--max_stesp'. (Did you mean one of: '--max_steps', "
                                    "'--num_steps'?)"),
    (["checkpoint", "convert", "a.mdl", "b.pt", "--allow_pickle=yes"], "Option '--allow_pickle' does not take a value."),
])
def test_click_messages_name_the_declared_flag_whichever_spelling_was_typed(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for spelled in (args, [a.replace("_", "-") if a.startswith("--") else a for a in args]):
        result = invoke(*spelled)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"Error: {message}"), result.output
    assert list(tmp_path.iterdir()) == []


def test_set_keeps_keys_and_values_as_typed(workdir):
    params = _parse(("train",), ["--set", "model.name=gpt-neox", "--set=runconfig.model_dir=my-runs/a_b"])
    assert params["overrides"] == ("model.name=gpt-neox", "runconfig.model_dir=my-runs/a_b")
    result = invoke("train", "--set", "runconfig.model_dir=my-runs/a_b", "--print-config")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output)["runconfig"]["model_dir"].endswith("my-runs/a_b")
    result = invoke("train", "--set", "runconfig.max-steps=3")  # a key is never respelled
    assert result.exit_code == 2 and "unknown key runconfig.max-steps" in result.output


@pytest.mark.parametrize("path, param", OPTIONS, ids=lambda x: " ".join(x) if isinstance(x, tuple) else x.opts[-1])
def test_every_option_shows_its_default_or_where_it_comes_from(path, param):
    ctx = click.Context(COMMANDS[path], info_name=path[-1])
    _, text = param.get_help_record(ctx)
    assert "[default: " in text or "[required" in text, text
    run_flag = next((o for o in run_options() if o.key and f"--{o.name}" in param.opts), None)
    if run_flag is not None and " ".join(path) in COMMAND_USES:  # a runconfig key: from the params file first
        assert f"[default: from runconfig.{run_flag.key}, else " in text, text


def test_appliance_only_flags_have_their_own_section():
    appliance = {f"--{o.name}" for o in run_options() if o.appliance_only}
    assert appliance == {"--max_wgt_servers", "--max_act_per_csx", "--transfer_processes", "--mount_dirs",
                         "--job_labels"}
    for command in COMMAND_USES:
        text = invoke(command, "--help").output
        head, _, section = text.partition("\nAppliance only:\n")
        section = section.split("\n\n")[0]
        assert {f for f in appliance if f in section} == appliance
        assert not any(f in head for f in appliance)
        assert "--num_csx" not in section and "--model_dir" not in section


def _example_lines(command: click.Command) -> list[tuple[tuple[str, ...], list[str]]]:
    """(command path, arguments) of each cs-run command in the command's examples (``a && b``: two)."""
    out = []
    for _, text in command.examples:
        for line in text.split("&&"):
            words = shlex.split(line)
            assert words[0] == "cs-run", line
            path = next(p for p in COMMANDS if tuple(words[1:1 + len(p)]) == p)
            out.append((path, words[1 + len(path):]))
    return out


@pytest.mark.parametrize("name", EXAMPLED)
def test_each_commands_help_ends_with_examples_that_parse(name, workdir):
    path = tuple(name.split())
    command = COMMANDS[path]
    text = invoke(*path, "--help").output
    examples = text.split("\nExamples:\n")[1]
    assert command.examples and all(line in examples for _, line in command.examples)
    examples = _example_lines(command)
    assert path in [p for p, _ in examples]
    for example_path, args in examples:
        _parse(example_path, args)
        if example_path == ("init",):  # cheap: it runs, and the commands after it find its files
            assert invoke(*example_path, *args).exit_code == 0
        elif " ".join(example_path) in COMMAND_USES:  # a run command's example resolves its params too (runs nothing)
            result = invoke(*example_path, *args, "--print_config")
            assert result.exit_code == 0, (example_path, args, result.output)
            assert "runconfig:" in result.output


def test_convert_help_names_every_model_with_a_hugging_face_converter():
    text = " ".join(invoke("checkpoint", "convert", "--help").output.split())
    specs = {name: registry.get_model_spec(name) for name in registry.registered_models()}
    with_one = {name: spec for name, spec in specs.items() if spec.hf_converter}
    assert len(with_one) >= 10
    for name, spec in with_one.items():
        assert all(f" {n}" in text for n in (name, *spec.hf_model_types)), name


@pytest.mark.parametrize("command", ["validate-only", "compile-only"])
def test_the_trace_only_commands_show_the_device_they_use(command, workdir):
    """They always trace on CSX: their --device default says so (it said CPU)."""
    assert _parse((command,), [])["device"] == "CSX"
    text = " ".join(invoke(command, "--help").output.split())
    assert "[default: CSX]" in text and "[default: CPU]" not in text
