"""Label selectors, parsed once and matched client-side (for the cache), with server semantics:
``k=v``, ``k==v``, ``k!=v`` (matches objects without k), ``k in (a,b)``, ``k notin (a,b)`` (matches
objects without k), ``k``, ``!k``; comma = AND."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_SET = re.compile(r"^\s*(?P<key>[^\s!=,()]+)\s+(?P<op>in|notin)\s+\((?P<values>[^()]*)\)\s*$")
_EQ = re.compile(r"^\s*(?P<key>[^\s!=,()]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=,()]*)\s*$")
_EXISTS = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=,()]+)\s*$")


class SelectorError(ValueError):
    """A label selector could not be parsed."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # in notin exists !exists
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op == "in":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # notin


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()
    text: str = ""

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        return parse_label_selector(text)

    @classmethod
    def equals(cls, labels: Mapping[str, str]) -> LabelSelector:
        """The selector matching every given ``key=value``."""
        return parse_label_selector(",".join(f"{k}={v}" for k, v in sorted(labels.items())))


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced parenthesis in selector {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise SelectorError(f"unbalanced parenthesis in selector {text!r}")
    parts.append("".join(current))
    return parts


def parse_label_selector(text: str) -> LabelSelector:
    """Parse ``text`` (the ``labelSelector`` query syntax). Empty text selects everything."""
    if not isinstance(text, str):
        raise SelectorError(f"a label selector is a string, got {type(text).__name__}")
    if not text.strip():
        return LabelSelector((), "")
    reqs: list[Requirement] = []
    for part in _split_top(text):
        if m := _SET.match(part):
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            reqs.append(Requirement(m["key"], m["op"], values))
        elif m := _EQ.match(part):
            reqs.append(Requirement(m["key"], "notin" if m["op"] == "!=" else "in", frozenset({m["value"]})))
        elif m := _EXISTS.match(part):
            reqs.append(Requirement(m["key"], "!exists" if m["neg"] else "exists"))
        else:
            raise SelectorError(f"cannot parse label selector requirement {part.strip()!r} in {text!r}")
    return LabelSelector(tuple(reqs), text)
