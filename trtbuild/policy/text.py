"""A policy's own text, edited where it stands: its paths re-based, rules added to its list.

Why edit the text rather than write the value again: a person's file carries comments
(why a tolerance is median, why a rule exists) that no value holds. Where a policy is
what its source text says, `tune`'s result and `to_yaml` for another folder are that
text with the few lines that change changed, every comment kept. The YAML nodes' marks
say where each value stands; a layout this cannot edit (a flow-style `precision`) gives
None, and the caller writes the value instead (`dump.human_yaml`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import yaml

from trtbuild.policy.dump import PolicyLike, flow, human_yaml, relative
from trtbuild.policy.load import PolicyLoader
from trtbuild.policy.source import spelled
from trtbuild.policy.specs import PATH_KEYS


def policy_paths(value: Any) -> set[Path]:
    """Every path a policy's value holds (the model, data files, image folders, ...)."""
    found: set[Path] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Path):
            found.add(item)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            stack += [getattr(item, f.name) for f in dataclasses.fields(item) if f.compare]
        elif isinstance(item, (tuple, list)):
            stack += item
    return found


def person_yaml(policy: PolicyLike, folder: Path | None) -> str:
    """`Policy.to_yaml`: the source's text where the policy is what it says (its paths
    re-based to `folder`, every comment kept); else `human_yaml` from the value."""
    src = policy.current_source
    if src is not None and src.text is not None:
        text = rebased_text(policy, folder) if folder is not None else src.text
        if text is not None:
            return text
    source = policy.source
    return human_yaml(policy, folder or (source.base_dir if source is not None else None))


def rebased_text(policy: Any, folder: Path) -> str | None:
    """The policy's source text for a file in `folder`: its relative paths and its editor's
    `$schema` comment re-based. None without a source text."""
    src = policy.current_source
    if src is None or src.text is None:
        return None
    if folder == src.base_dir:
        return src.text
    text = rebased(src.text, src.base_dir, folder, policy_paths(policy))
    if text is None:
        return None
    marker = "# yaml-language-server: $schema="
    rows = text.splitlines(keepends=True)
    if rows and rows[0].startswith(marker):
        value = rows[0][len(marker) :].strip()
        if value and not os.path.isabs(value) and "://" not in value:
            new = relative(spelled(src.base_dir, value), folder)
            rows[0] = f"{marker}{new}\n"
    return "".join(rows)


def rebased(text: str, base: Path, folder: Path, paths: set[Path]) -> str | None:
    """`text` with each relative path among `paths` written from `folder` instead of `base`.

    Absolute paths stay as they are; a path is the string value of a path key
    (`PATH_KEYS`) that names one of `paths` from `base`. None where the text cannot be
    read as YAML.
    """
    try:
        root = yaml.compose(text, Loader=PolicyLoader)
    except yaml.YAMLError:
        return None
    edits = []
    for key, node in _scalars(root):
        value = node.value
        if key not in PATH_KEYS:
            continue
        if not value or os.path.isabs(value) or "://" in value:
            continue
        target = (base / value).resolve()
        if target in paths:
            new = relative(spelled(base, value, target), folder)
            edits.append((node.start_mark.index, node.end_mark.index, new))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + flow(new) + text[end:]
    return text


def with_rules(text: str, lines: list[str]) -> str | None:
    """`text` with `lines` (each a `- {id: ...}` rule, or a `# comment`) after the rules of
    `precision.rules`, in the list's own indentation. None for a layout it cannot edit."""
    try:
        root = yaml.compose(text, Loader=PolicyLoader)
    except yaml.YAMLError:
        return None
    if not lines:
        return text
    if not isinstance(root, yaml.MappingNode) or root.flow_style:
        return None
    precision = _value(root, "precision")
    if precision is None:
        block = "\n".join(["precision:", "  rules:", *(f"    {x}" for x in lines)])
        return text.rstrip("\n") + "\n" + block + "\n"
    if not isinstance(precision, yaml.MappingNode) or precision.flow_style:
        return None
    rules = _value(precision, "rules")
    indent = precision.value[0][0].start_mark.column
    if rules is None:
        at = _line_end(text, precision.end_mark)
        block = [f"{' ' * indent}rules:", *(f"{' ' * (indent + 2)}{x}" for x in lines)]
        return _ended(text[:at]) + "\n".join(block) + "\n" + text[at:]
    if isinstance(rules, yaml.SequenceNode) and not rules.flow_style and rules.value:
        column = rules.start_mark.column  # the dash's: `-   id:` is a rule too
        at = _line_end(text, _content_end(rules.value[-1]))
        return _ended(text[:at]) + "".join(f"{' ' * column}{x}\n" for x in lines) + text[at:]
    if isinstance(rules, yaml.SequenceNode):  # flow style: `rules: []` or `[{...}, {...}]`
        own = [f"- {text[n.start_mark.index : n.end_mark.index]}" for n in rules.value]
        body = "".join(f"\n{' ' * (indent + 2)}{x}" for x in [*own, *lines])
        return text[: rules.start_mark.index].rstrip(" ") + body + text[rules.end_mark.index :]
    return None


def _scalars(node: yaml.Node) -> list[tuple[str | None, yaml.ScalarNode]]:
    """The scalar values under `node`, each with the key it is the value of (None in a list)."""
    found: list[tuple[str | None, yaml.ScalarNode]] = []
    stack: list[tuple[str | None, yaml.Node]] = [(None, node)]
    while stack:
        key, item = stack.pop()
        if isinstance(item, yaml.ScalarNode):
            found.append((key, item))
        elif isinstance(item, yaml.MappingNode):
            stack += [(getattr(k, "value", None), v) for k, v in item.value]
        elif isinstance(item, yaml.SequenceNode):
            stack += [(None, v) for v in item.value]
    return found


def _value(mapping: yaml.MappingNode, key: str) -> yaml.Node | None:
    return next((v for k, v in mapping.value if getattr(k, "value", None) == key), None)


def _ended(text: str) -> str:
    """`text` ending a line: a file whose last line has no newline is not run into."""
    return text if not text or text.endswith("\n") else text + "\n"


def _content_end(node: yaml.Node) -> Any:
    """Where `node`'s own text ends. A block collection's end mark is the next token's
    start, which may be a later key of the same mapping (`default:` after `rules:`): its
    last value's end is the end of what it holds."""
    while isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and not node.flow_style:
        if not node.value:
            break
        last = node.value[-1]
        node = last[1] if isinstance(last, tuple) else last
    return node.end_mark


def _line_end(text: str, mark: Any) -> int:
    """The index just past the line a node ends on (its end mark may be the next line's
    start, where a block node ends)."""
    index = mark.index
    if mark.column == 0:
        return index
    end = text.find("\n", index)
    return len(text) if end < 0 else end + 1
