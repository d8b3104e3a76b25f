"""`policy-fields`: every field of docs/policy.schema.json as one table, made at build time.

Why: the policy reference must name every field, and the schema (`make schema`, from
`trtbuild.policy`) is what the loader validates against; a table written by hand would
drift from it. A mapping keyed by the user's names (an input, an output, a point) shows
as `NAME`; the per-output tolerances, whose keys are those of the default, are not
listed twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive, directives

SCHEMA = Path(__file__).resolve().parents[1] / "policy.schema.json"
HUGE = 1e15  # bounds past this say "no practical limit" and are not shown


def _bounds(node: dict[str, Any]) -> str:
    low = node.get("minimum", node.get("exclusiveMinimum"))
    high = node.get("maximum", node.get("exclusiveMaximum"))
    low = None if low is not None and abs(low) >= HUGE else low
    high = None if high is not None and abs(high) >= HUGE else high
    if low is None and high is None:
        return ""
    left = "(" if "exclusiveMinimum" in node else "["
    right = ")" if "exclusiveMaximum" in node else "]"
    if low is None:
        return f" ≤ {_number(high)}"
    if high is None:
        return f" ≥ {_number(low)}" if left == "[" else f" > {_number(low)}"
    return f" in {left}{_number(low)}, {_number(high)}{right}"


def summary(node: dict[str, Any]) -> str:
    """One schema node's type in words: `one of a, b`, `integer in [1, 16]`, `list of ...`."""
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(json.dumps(v) if v is None else str(v) for v in node["enum"])
    for alt in ("oneOf", "anyOf"):
        if alt in node:
            return " or ".join(summary(a) for a in node[alt])
    kind = node.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        items = node.get("items")
        text = f"list of {summary(items)}" if isinstance(items, dict) else "list"
        if node.get("minItems") == node.get("maxItems") and "minItems" in node:
            return f"{text}, {node['minItems']} long"
        return text
    if kind == "object":
        return "mapping"
    if kind in ("integer", "number"):
        return kind + _bounds(node)
    return kind


def fields(node: dict[str, Any], path: str) -> list[tuple[str, str, str]]:
    """(field, type, description) for `node` and everything under it, in the schema's order."""
    rows = [(path, summary(node), node.get("description", ""))] if path else []
    for key, child in node.get("properties", {}).items():
        rows += fields(child, f"{path}.{key}" if path else key)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        if path == "accuracy.tolerances.outputs":
            rows.append((f"{path}.NAME", "mapping", "the keys of accuracy.tolerances.default"))
        else:  # a point's own mapping holds dims keyed by input: INPUT, not a second NAME
            rows += fields(extra, f"{path}.{'INPUT' if path.endswith('.NAME') else 'NAME'}")
    items = node.get("items")
    if isinstance(items, dict) and "properties" in items:
        rows += [r for r in fields(items, f"{path}[]") if r[0] != f"{path}[]"]
    for alt in node.get("oneOf", []) + node.get("anyOf", []):
        for key, child in alt.get("properties", {}).items():
            rows += fields(child, f"{path}.{key}")
    return rows


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


class PolicyFields(Directive):
    """The list; `:schema:` names another schema file (default: docs/policy.schema.json).

    A definition list, not a table: dotted paths are long, and each description gets the
    page's whole width under its field.
    """

    option_spec = {"schema": directives.unchanged}  # noqa: RUF012 (docutils' own interface)

    def run(self) -> list[nodes.Node]:
        path = Path(self.options.get("schema", SCHEMA))
        self.state.document.settings.record_dependencies.add(str(path))
        schema = json.loads(path.read_text(encoding="utf-8"))
        items = nodes.definition_list(classes=["policy-fields"])
        source, line = self.state_machine.get_source_and_line(self.lineno)
        for name, kind, text in fields(schema, ""):
            term = nodes.term()
            term += nodes.literal(text=name)
            term += nodes.classifier(text=kind)
            definition = nodes.definition()
            if text:
                definition += nodes.paragraph(text=text)
            item = nodes.definition_list_item()
            for node in (item, term, definition):
                node.source, node.line = source, line
            item += term
            item += definition
            items += item
        return [items]


def setup(app) -> dict[str, Any]:
    app.add_directive("policy-fields", PolicyFields)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
