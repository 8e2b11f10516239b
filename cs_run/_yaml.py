"""Params YAML, read as hostile input: bounded in size, depth and alias expansion; strict about keys.

A params file is a small document a person wrote. Anything else is refused before it is built into
Python objects, with one error naming the file and line:

* not a regular file (a FIFO would block, ``/dev/zero`` never ends), more than :data:`MAX_BYTES` bytes,
  or not UTF-8;
* nesting deeper than :data:`MAX_DEPTH` (PyYAML would recurse until RecursionError);
* more than :data:`MAX_VALUES` values once aliases are expanded (a "billion laughs" file); every node is
  visited once, however many aliases point at it;
* a key that is not a string, a control character (NUL), an alias inside the value it names (a loop);
* a nan or infinite number anywhere (``.nan``, ``.inf``, ``1e999``).

A key given twice in one mapping is the one exception that loads: the Model Zoo's own files have them
(Cerebras-GPT's 256m_mup.yaml, Releases 2.0-2.3, twice with one value; Release 2.4's gemma2 27b file,
``trainer.init.callbacks`` twice with two), and the vendor's loader, PyYAML's, keeps the last. So does
cs-run, with a note of the run naming both lines (:func:`cs_run._logging.defer`).
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from typing import Any, Optional

import yaml

from cs_run._logging import defer
from cs_run.errors import ParamsError

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_VALUES", "check_regular_file", "read_text", "parse", "parse_value", "check_finite"]

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_VALUES = 100_000
_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"


class _TooDeep(Exception):
    def __init__(self, mark) -> None:
        self.mark = mark


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses to compose deeper than MAX_DEPTH (it would otherwise recurse without bound)."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# YAML 1.2's floats: PyYAML (YAML 1.1) reads an exponent without a dot, ``1e-05``, as a string, which
# the Model Zoo's configs (pydantic) then coerce to the float their fields declare; params files carry it
# (Release 2.10's gptj TRC2 file: ``layer_norm_epsilon: 1e-05``). It is a number here too.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _shown(path: str | os.PathLike) -> str:
    """``path`` for a one-line message (a 5000-character path is cut in the middle)."""
    text = str(path)
    return text if len(text) <= 200 else f"{text[:100]}...{text[-80:]} ({len(text)} characters)"


def check_regular_file(path: str | os.PathLike) -> None:
    """Refuse a params path that is missing, a folder, or not a regular file (a FIFO would block the read
    until a writer came; a device never ends), before it is opened.

    Raises:
        ParamsError: naming the path and what it is.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise ParamsError(f"params file not found: {_shown(path)}") from None
        raise ParamsError(f"params file cannot be read: {_shown(path)} ({e.strerror or e}); check the --params "
                          "path") from None
    if stat.S_ISDIR(mode):
        raise ParamsError(f"params path is a folder, expected a YAML file: {_shown(path)}")
    if not stat.S_ISREG(mode):
        kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or \
            stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise ParamsError(f"params file {_shown(path)} is {kind}, not a regular file; write the params to a file "
                          "and give its path")


def read_text(path: str | os.PathLike) -> str:
    """The file's text: a regular file (:func:`check_regular_file`), at most MAX_BYTES, UTF-8. Raises
    ParamsError naming the file (and line)."""
    check_regular_file(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ParamsError(f"params file cannot be read: {_shown(path)} ({e.strerror or e})") from None
    if len(data) > MAX_BYTES:
        raise ParamsError(f"params file is larger than {MAX_BYTES // (1 << 20)} MiB ({path}); a params file is a "
                          "short YAML document, check the --params path")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ParamsError(f"params file is not UTF-8 text: byte 0x{data[e.start]:02x} ({path}:{line}); save it "
                          "as UTF-8") from None


def parse(text: str, where: Optional[str], prefix: str = "") -> tuple[Any, dict[str, int]]:
    """Parse one YAML document; returns the data and the 1-based line of every key path.

    ``where`` names the file in messages (None: a ``--set`` value, "set on the command line"); key
    paths start at ``prefix`` and are dotted, list items ``[i]``: ``optimizer.learning_rate[0].total_iters``.
    """
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as e:  # a control character (NUL, ...): the reader refuses the whole text
        at = f"{where}:{text.count(chr(10), 0, e.position) + 1}" if where else "set on the command line"
        code = e.character if isinstance(e.character, int) else ord(text[e.position])
        raise ParamsError(f"params file is not valid YAML ({at}): character #x{code:04x} is not allowed in YAML "
                          "text; remove it (the file may be binary or damaged)") from None
    try:
        try:
            node = loader.get_single_node()
        except _TooDeep as e:
            raise ParamsError(f"params: {prefix or 'file'}: nesting deeper than {MAX_DEPTH} levels "
                              f"{_loc(where, e.mark)}") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f"{where}:{mark.line + 1}" if mark else where
            raise ParamsError(f"params file is not valid YAML ({at}): {getattr(e, 'problem', None) or e}") from None
        if node is None:
            return None, {}
        lines: dict[str, int] = {}
        _Walk(where, lines).node(node, prefix)
        try:
            data = loader.construct_document(node)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f"{where}:{mark.line + 1}" if mark else where
            raise ParamsError(f"params file is not valid YAML ({at}): {getattr(e, 'problem', None) or e}") from None
    finally:
        loader.dispose()
    return data, lines


def _loc(where: Optional[str], mark) -> str:
    return f"({where}:{mark.line + 1})" if where else "(set on the command line)"


def parse_value(text: str, key: str) -> Any:
    """One ``--set KEY=VALUE`` value, read as YAML with the same limits; text YAML cannot read stays a string."""
    try:
        value, _ = parse(text, None, key)
    except ParamsError as e:
        if "not valid YAML" in str(e):
            return text
        raise
    return value


class _Walk:
    """One pass over the composed graph: key lines, key checks, non-finite numbers, expanded size."""

    def __init__(self, where: Optional[str], lines: dict[str, int]) -> None:
        self.where, self.lines = where, lines
        self.sizes: dict[int, int] = {}  # node id -> values below it, aliases expanded (each node once)
        self.open: set[int] = set()  # the nodes being walked: an alias to one of them is a loop

    def at(self, node) -> str:
        return f"{self.where}:{node.start_mark.line + 1}" if self.where else "set on the command line"

    def node(self, node, path: str) -> int:
        if id(node) in self.open:  # PyYAML builds it as a value holding itself; every reader would recurse
            raise ParamsError(f"params: {path or 'value'}: a YAML alias to a value that holds it (a loop, "
                              f"{self.at(node)}); write the value out instead of the alias")
        known = self.sizes.get(id(node))
        if known is not None:  # an alias: its size counts again, its nodes are not walked again
            return known
        self.open.add(id(node))
        try:
            size = self._children(node, path)
        finally:
            self.open.discard(id(node))
        if size > MAX_VALUES:
            raise ParamsError(f"params: more than {MAX_VALUES} values once YAML aliases are expanded "
                              f"({self.at(node)}); write the values out or use fewer nested aliases")
        self.sizes[id(node)] = size
        return size

    def _children(self, node, path: str) -> int:
        size = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE:
                    size += self.node(value_node, path)
                    continue
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR:
                    shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else f"a {_kind(key_node)}"
                    raise ParamsError(f"params: key {shown!r}{' under ' + path if path else ''} is not a string "
                                      f"({self.at(key_node)}); quote it or use a name")
                key = key_node.value
                key_path = f"{path}.{key}" if path else key
                if key in seen:
                    self._given_twice(key_path, seen[key], key_node, value_node)
                seen[key] = (key_node, value_node)
                self.lines[key_path] = key_node.start_mark.line + 1
                size += self.node(value_node, key_path)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                item_path = f"{path}[{i}]"
                self.lines.setdefault(item_path, item.start_mark.line + 1)
                size += self.node(item, item_path)
        elif node.tag == "tag:yaml.org,2002:float":
            value = _FLOAT.construct_yaml_float(node)
            if not math.isfinite(value):
                raise ParamsError(f"params: {path or 'value'}: expected a finite number, got {node.value} "
                                  f"({self.at(node)})")
        return size

    def _given_twice(self, key_path: str, first: tuple, key_node, value_node) -> None:
        """The last of a key given twice is its value (PyYAML's rule, the vendor's loader): the first one's
        lines go, and the run notes it."""
        first_key, first_value = first
        for path in [p for p in self.lines if p.startswith((f"{key_path}.", f"{key_path}["))]:
            del self.lines[path]
        both = f"{self.at(first_key)} and {self.at(key_node)}"
        if yaml.serialize(first_value) == yaml.serialize(value_node):
            defer("cs_run.params", f"params: {key_path} is given twice with the same value ({both})")
        else:
            defer("cs_run.params", f"params: {key_path} is given twice ({both}); the last one is used, as the Model "
                                   "Zoo's YAML loader does: delete the one you do not mean")


_FLOAT = yaml.SafeLoader("")


def _kind(node) -> str:
    return {yaml.MappingNode: "mapping", yaml.SequenceNode: "list"}.get(type(node), "value")


def check_finite(value: Any, path: str, where: str) -> None:
    """Raise ParamsError for a nan or infinite float anywhere in ``value`` (an override built in Python)."""
    stack, seen = [(value, path)], set()
    while stack:
        item, item_path = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ParamsError(f"params: {item_path}: expected a finite number, got {item}{where}")
        if isinstance(item, (dict, list, tuple)) and id(item) not in seen:
            seen.add(id(item))
            children = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((v, f"{item_path}.{k}" if isinstance(item, dict) else f"{item_path}[{k}]")
                         for k, v in children)
