"""Label and field selectors, query booleans: parsing (400 with the server's texts) and matching.

Label selectors use the project's parser (``shared.kube.selectors``, a port of apimachinery's);
field selectors follow apimachinery's ``fields.ParseSelector``. Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.kube.selectors import LabelSelector, SelectorError
from shared.kube.selectors import parse_label_selector as _parse_labels

from .errors import bad_request


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a ``labelSelector`` query value; a malformed one is a 400 with the server's message."""
    try:
        return _parse_labels(text or "")
    except SelectorError as exc:
        raise bad_request(str(exc)) from None


def labels_match(selector: LabelSelector, obj: dict[str, Any]) -> bool:
    if not selector.requirements:
        return True
    return selector.matches((obj.get("metadata") or {}).get("labels") or {})


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    equal: bool
    value: str


def _split_terms(text: str) -> list[str]:
    """Comma-separated terms; a backslash-escaped comma stays inside its term (escape kept)."""
    terms, start, escaped = [], 0, False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _unescape(value: str) -> str:
    out, escaped = [], False
    for ch in value:
        if escaped:
            if ch not in "\\,=":
                raise bad_request(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            raise bad_request(f"invalid field selector: unescaped character in value: {ord(ch)}")
        else:
            out.append(ch)
    if escaped:
        raise bad_request("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def parse_field_selector(text: str | None, supported: tuple[str, ...]) -> list[FieldRequirement]:
    """Parse ``metadata.name=x,status.phase!=Running``; only ``supported`` field labels are allowed.

    As the server does: terms are sorted before they are checked, nothing is trimmed, the first
    operator in a term splits it, and ``,``/``=``/``\\`` in a value must be backslash-escaped."""
    if not text:
        return []
    out: list[FieldRequirement] = []
    for term in sorted(_split_terms(text)):
        if not term:
            continue
        for i in range(len(term)):
            op = next((o for o in ("!=", "==", "=") if term.startswith(o, i)), None)
            if op is not None:
                path, value = term[:i], term[i + len(op) :]
                break
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        out.append(FieldRequirement(path, op != "!=", _unescape(value)))
    for req in out:
        if req.path not in supported:
            raise bad_request(f"field label not supported: {req.path}")
    return out


def field_value(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for seg in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(seg)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def fields_match(reqs: list[FieldRequirement], obj: dict[str, Any]) -> bool:
    return all((field_value(obj, r.path) == r.value) == r.equal for r in reqs)


def parse_query_bool(value: str | None) -> bool:
    """A boolean query parameter as the server reads it: absent → false; ``0`` or ``false`` (any
    case) → false; anything else, even ``maybe`` or an empty value → true."""
    if value is None:
        return False
    return value != "0" and value.lower() != "false"


__all__ = [
    "FieldRequirement",
    "LabelSelector",
    "field_value",
    "fields_match",
    "labels_match",
    "parse_field_selector",
    "parse_label_selector",
    "parse_query_bool",
]
