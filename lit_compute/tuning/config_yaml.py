"""A LightningCLI config as plain data: read it, edit it at a path, write it back with a comment per changed line.

Pure logic (no torch, no Lightning): the knobs edit the dict, the trials and the tuned file are written from it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

ConfigPath = tuple[Any, ...]  # keys and list indices from the top, e.g. ("trainer", "callbacks", 2)


class ConfigError(ValueError):
    """A config the tune cannot read: names the file and what to fix."""


def load_config(path: str | Path) -> dict[str, Any]:
    """The YAML file at ``path`` as a dict, or a ConfigError naming the file and the problem."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(
            f"--config {str(path)!r}: no such file; pass the YAML you train with (lit-compute fit --config FILE)"
        )
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {str(path)!r} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"--config {str(path)!r} must be a mapping with trainer:, model: (and data:) sections, "
            f"got {type(data).__name__}"
        )
    return data


def config_hash(config: Mapping[str, Any]) -> str:
    """A short hash of a config's content (key order ignored)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


def section(config: dict[str, Any], *keys: str) -> dict[str, Any]:
    """The mapping at ``keys``, created when missing."""
    node = config
    for key in keys:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    return node


def as_list(node: dict[str, Any], key: str) -> list[Any]:
    """``node[key]`` as a list (a single entry or a missing key made into one), stored back."""
    value = node.get(key)
    if value is None:
        value = []
    elif not isinstance(value, list):
        value = [value]
    node[key] = value
    return value


def class_name(entry: Any) -> str:
    """The class path of a ``class_path`` entry or a shorthand string ('' for anything else)."""
    if isinstance(entry, dict):
        return str(entry.get("class_path", ""))
    return entry if isinstance(entry, str) else ""


def short(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def add_callback(config: dict[str, Any], class_path: str, init_args: dict[str, Any] | None = None) -> ConfigPath:
    """Append a callback entry to ``trainer.callbacks``; returns its path."""
    callbacks = as_list(section(config, "trainer"), "callbacks")
    entry: dict[str, Any] = {"class_path": class_path}
    if init_args:
        entry["init_args"] = dict(init_args)
    callbacks.append(entry)
    return ("trainer", "callbacks", len(callbacks) - 1)


def data_section(config: dict[str, Any], datamodule_class: str | None) -> dict[str, Any] | None:
    """``data`` as ``{class_path, init_args}`` (a shorthand or bare init args filled in with the class the run
    used), or None when the config has no datamodule."""
    data = config.get("data")
    if datamodule_class is None:
        return None
    if isinstance(data, str) or data is None:
        data = {"class_path": datamodule_class, "init_args": {}}
    elif "class_path" not in data:
        data = {"class_path": datamodule_class, "init_args": dict(data)}
    if not isinstance(data.get("init_args"), dict):
        data["init_args"] = {}
    config["data"] = data
    return data


def paths_differing(old: Any, new: Any, prefix: ConfigPath = ()) -> list[ConfigPath]:
    """The deepest paths where ``new`` differs from ``old`` (added entries included)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[ConfigPath] = []
        for key in new:
            if key not in old:
                out.append((*prefix, key))
            else:
                out += paths_differing(old[key], new[key], (*prefix, key))
        return out
    if (
        isinstance(old, list)
        and isinstance(new, list)
        and len(new) >= len(old)
        and all(class_name(a) == class_name(b) for a, b in zip(old, new))
    ):
        out = []
        for i, item in enumerate(new):
            out += paths_differing(old[i], item, (*prefix, i)) if i < len(old) else [(*prefix, i)]
        return out
    return [] if old == new else [prefix]


# -- the user's comments ------------------------------------------------------------------------------------
def user_comments(text: str) -> tuple[dict[ConfigPath, str], dict[ConfigPath, list[str]]]:
    """The comments of a YAML file by the config path they sit beside: ``inline[path]`` at the end of the line that
    sets ``path``, ``above[path]`` the full-line comments just before it (the file's opening comments go above its
    first key). Located with PyYAML's own node marks, so any YAML the tune reads is understood; a file that does not
    compose gives none."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return {}, {}
    lines = text.splitlines()
    starts: dict[int, ConfigPath] = {}  # line -> the deepest path whose key or item starts there
    token_end: dict[int, int] = {}  # line -> the column after the last key or scalar ending on it

    def note(node: yaml.Node) -> None:
        if node.end_mark.line == node.start_mark.line:
            token_end[node.end_mark.line] = max(token_end.get(node.end_mark.line, 0), node.end_mark.column)

    def begins(line: int, path: ConfigPath) -> None:
        if line not in starts or len(path) > len(starts[line]):
            starts[line] = path

    def walk(node: yaml.Node, path: ConfigPath) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                here = (*path, key.value)
                begins(key.start_mark.line, here)
                note(key)
                walk(value, here)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                begins(item.start_mark.line, (*path, i))
                walk(item, (*path, i))
        else:
            note(node)

    if root is None:
        return {}, {}
    walk(root, ())
    inline: dict[ConfigPath, str] = {}
    above: dict[ConfigPath, list[str]] = {}
    pending: list[str] = []
    for number, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#"):  # its own indentation kept (one space after the hash is the emitter's)
            text = stripped[1:].rstrip()
            pending.append(text[1:] if text.startswith(" ") else text)
            continue
        if number not in starts:
            continue
        path = starts[number]
        if pending:
            above[path], pending = pending, []
        rest = line[token_end.get(number, len(line)) :].lstrip().lstrip(":").strip()
        if rest.startswith("#"):
            inline[path] = rest[1:].strip()
    return inline, above


# -- writing YAML with comments ------------------------------------------------------------------------------
def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text[:-4].strip() if text.endswith("\n...") or text.endswith(" ...") else text.removesuffix("...").strip()


def _comment(comments: Mapping[ConfigPath, str], path: ConfigPath) -> str:
    text = comments.get(path)
    return f"  # {text}" if text else ""


def _emit(
    value: Any,
    path: ConfigPath,
    indent: int,
    comments: Mapping[ConfigPath, str],
    lines: list[str],
    first_prefix: str | None = None,
    above: Mapping[ConfigPath, list[str]] | None = None,
) -> None:
    pad = " " * indent
    above = above or {}
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for n, (key, item) in enumerate(items):
        here = (*path, key)
        # full-line comments before the line: a list item's and its first key's both go above the dash line
        comment_pad = first_prefix.replace("-", " ") if n == 0 and first_prefix is not None else pad
        for text in above.get(here, []) + (
            above.get((*here, next(iter(item))), [])
            if isinstance(value, list) and isinstance(item, dict) and item
            else []
        ):
            lines.append(f"{comment_pad}# {text}" if text else f"{comment_pad}#")
        head = f"{pad}{_scalar(key)}:" if isinstance(value, dict) else f"{pad}-"
        if n == 0 and first_prefix is not None:  # a mapping that is a list item: its first key on the dash line
            head = first_prefix + head.lstrip()
        if isinstance(item, (dict, list)) and item:
            if isinstance(value, list) and isinstance(item, dict):
                _emit(
                    item,
                    here,
                    indent + 2,
                    comments,
                    lines,
                    first_prefix=f"{pad}- ",
                    above={k: v for k, v in above.items() if k != (*here, next(iter(item)))},
                )
                if comments.get(here):
                    lines[_first_line_of(lines, pad)] += _comment(comments, here)
                continue
            lines.append(head + _comment(comments, here))
            _emit(item, here, indent + 2, comments, lines, above=above)
        else:
            lines.append(f"{head} {_scalar(item)}{_comment(comments, here)}")


def _first_line_of(lines: list[str], pad: str) -> int:
    # the list item just emitted starts at the last line beginning with "<pad>- "
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(pad + "- "):
            return i
    return len(lines) - 1


def dump_yaml(
    config: Mapping[str, Any],
    comments: Mapping[ConfigPath, str] | None = None,
    header: list[str] | None = None,
    above: Mapping[ConfigPath, list[str]] | None = None,
) -> str:
    """``config`` as block-style YAML with ``comments[path]`` at the end of the line that sets ``path`` and the
    lines ``above[path]`` as full-line comments before it."""
    lines = [f"# {line}" if line else "#" for line in (header or [])]
    _emit(dict(config), (), 0, comments or {}, lines, above=above)
    text = "\n".join(lines) + "\n"
    if yaml.safe_load(text) != yaml.safe_load(yaml.safe_dump(dict(config))):  # pragma: no cover - emitter bug
        raise AssertionError("dump_yaml wrote a document that does not read back as the config")
    return text
