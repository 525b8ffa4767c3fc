"""Label and field selectors: parsing (400 on malformed input) and matching. Pure functions."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import bad_request

_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        has = self.key in labels
        v = labels.get(self.key)
        if self.op == "=":
            return has and v == self.values[0]
        if self.op == "!=":
            return not has or v != self.values[0]
        if self.op == "in":
            return has and v in self.values
        if self.op == "notin":
            return not has or v not in self.values
        if self.op == "exists":
            return has
        return not has  # "!"


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _check_key(key: str, selector: str) -> None:
    if not key or len(key) > 317 or not _KEY.match(key):
        raise bad_request(
            f"unable to parse requirement: invalid label key \"{key}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )


def _check_value(value: str) -> None:
    if len(value) > 63 or not _VALUE.match(value):
        raise bad_request(
            f"unable to parse requirement: values[0]: Invalid value: \"{value}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )


_SET = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s*\(([^()]*)\)\s*$")


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse ``a=b,c!=d,e in (f,g),!h,i``; raise 400 naming the selector when malformed."""
    if not text or not text.strip():
        return []
    reqs: list[Requirement] = []
    for raw in _split_top(text):
        part = raw.strip()
        if not part:
            raise bad_request(f"unable to parse requirement: found '', expected: identifier in selector \"{text}\"")
        m = _SET.match(part)
        if m:
            key, op, vals = m.group(1), m.group(2), m.group(3)
            _check_key(key, text)
            values = tuple(v.strip() for v in vals.split(",")) if vals.strip() else ()
            if not values:
                raise bad_request("unable to parse requirement: for 'in', 'notin' operators, values set can't be empty")
            for v in values:
                _check_value(v)
            reqs.append(Requirement(key, op, values))
            continue
        for op_text, op in (("!=", "!="), ("==", "="), ("=", "=")):
            if op_text in part:
                key, _, value = part.partition(op_text)
                key, value = key.strip(), value.strip()
                _check_key(key, text)
                _check_value(value)
                reqs.append(Requirement(key, op, (value,)))
                break
        else:
            if part.startswith("!"):
                key = part[1:].strip()
                _check_key(key, text)
                reqs.append(Requirement(key, "!"))
            elif re.search(r"[\s()]", part):
                raise bad_request(
                    f"unable to parse requirement: found '{part}', expected: '=', '!=', '==', 'in', notin'"
                )
            else:
                _check_key(part, text)
                reqs.append(Requirement(part, "exists"))
    return reqs


def labels_match(reqs: list[Requirement], obj: dict[str, Any]) -> bool:
    if not reqs:
        return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(r.matches(labels) for r in reqs)


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    equal: bool
    value: str


def parse_field_selector(text: str | None, supported: tuple[str, ...], is_custom: bool) -> list[FieldRequirement]:
    """Parse ``metadata.name=x,status.phase!=Running``; only ``supported`` labels are allowed."""
    if not text or not text.strip():
        return []
    out: list[FieldRequirement] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        for op_text, equal in (("!=", False), ("==", True), ("=", True)):
            if op_text in part:
                path, _, value = part.partition(op_text)
                break
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        path = path.strip()
        if path not in supported:
            if is_custom:
                raise bad_request(f'"{path}" is not a known field selector: only "metadata.name", "metadata.namespace"')
            raise bad_request(f"field label not supported: {path}")
        out.append(FieldRequirement(path, equal, value.strip()))
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


def parse_go_bool(value: str | None, name: str) -> bool:
    """Go's strconv.ParseBool, as the server parses query booleans (kubernetes-asyncio sends ``True``)."""
    if value is None or value == "":
        return False
    if value in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if value in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise bad_request(f'invalid value for {name}: strconv.ParseBool: parsing "{value}": invalid syntax')


__all__ = [
    "FieldRequirement",
    "Requirement",
    "field_value",
    "fields_match",
    "labels_match",
    "parse_field_selector",
    "parse_go_bool",
    "parse_label_selector",
]
