"""Label selectors, parsed once and matched client-side (for the cache), with server semantics:
``k=v``, ``k==v``, ``k!=v`` (matches objects without k), ``k in (a,b)``, ``k notin (a,b)`` (matches
objects without k), ``k``, ``!k``, ``k>1``, ``k<1`` (integer values); comma = AND.

The parser follows apimachinery's ``labels.Parse`` token by token, so what it accepts and the
text of each error are the API server's (the emulator answers a malformed ``labelSelector`` with
these messages).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from shared.kube.names import is_qualified_name, is_valid_label_value


class SelectorError(ValueError):
    """A label selector could not be parsed; the message is the API server's."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # in notin exists !exists gt lt
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op == "in":
            return present and labels[self.key] in self.values
        if self.op in ("gt", "lt"):
            try:
                have, bound = int(labels[self.key]), int(next(iter(self.values)))
            except (KeyError, ValueError, StopIteration):
                return False
            return have > bound if self.op == "gt" else have < bound
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


# --- lexer ------------------------------------------------------------------------------------

_SYMBOLS = {
    ")": "CLOSE",
    ",": "COMMA",
    "!": "NOT",
    "==": "EQ2",
    "=": "EQ",
    ">": "GT",
    "<": "LT",
    "!=": "NE",
    "(": "OPEN",
}
_KEYWORDS = {"in": "IN", "notin": "NOTIN"}
_SPECIAL = set("=!(),><")
_WHITESPACE = set(" \t\r\n")


def _tokens(text: str) -> list[tuple[str, str]]:
    """``(token, literal)`` pairs ending with ``("END", "")``, as the Go lexer scans them."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            out.append(("END", ""))
            return out
        if text[i] in _SPECIAL:
            # The longest run of symbol characters that still forms a known symbol.
            buf, best, j = "", None, i
            while j < n and text[j] in _SPECIAL:
                buf += text[j]
                if buf in _SYMBOLS:
                    best = (_SYMBOLS[buf], buf, j + 1)
                elif best is not None:
                    break
                j += 1
            if best is None:
                out.append(("ERROR", f"error expected: keyword found '{buf}'"))
                i = j
                continue
            out.append((best[0], best[1]))
            i = best[2]
            continue
        j = i
        while j < n and text[j] not in _WHITESPACE and text[j] not in _SPECIAL:
            j += 1
        word = text[i:j]
        out.append((_KEYWORDS.get(word, "ID"), word))
        i = j


# --- parser -----------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.items = _tokens(text)
        self.pos = 0

    def lookahead(self, values: bool = True) -> tuple[str, str]:
        tok, lit = self.items[self.pos]
        return ("ID" if values and tok in ("IN", "NOTIN") else tok), lit

    def consume(self, values: bool = True) -> tuple[str, str]:
        tok, lit = self.lookahead(values)
        self.pos += 1
        return tok, lit

    def parse(self) -> list[Requirement]:
        reqs: list[Requirement] = []
        while True:
            tok, lit = self.lookahead()
            if tok == "END":
                return reqs
            if tok not in ("ID", "NOT"):
                raise SelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")
            try:
                reqs.append(self.requirement())
            except SelectorError as exc:
                raise SelectorError(f"unable to parse requirement: {exc}") from None
            tok, lit = self.consume()
            if tok == "END":
                return reqs
            if tok != "COMMA":
                raise SelectorError(f"found '{lit}', expected: ',' or 'end of string'")
            tok2, lit2 = self.lookahead()
            if tok2 not in ("ID", "NOT"):
                raise SelectorError(f"found '{lit2}', expected: identifier after ','")

    def requirement(self) -> Requirement:
        op = ""
        tok, lit = self.consume()
        if tok == "NOT":
            op = "!exists"
            tok, lit = self.consume()
        if tok != "ID":
            raise SelectorError(f"found '{lit}', expected: identifier")
        key = lit
        _check_key(key, "<nil>")
        if self.lookahead()[0] in ("END", "COMMA"):
            return _requirement(key, op or "exists", [])
        if op:  # "!k" followed by anything but "," or the end
            return _requirement(key, op, [])
        tok, lit = self.consume(values=False)
        ops = {"IN": "in", "NOTIN": "notin", "EQ": "in", "EQ2": "in", "NE": "notin", "GT": "gt", "LT": "lt"}
        if tok not in ops:
            raise SelectorError(f"found '{lit}', expected: in, notin, =, ==, !=, gt, lt")
        if tok in ("IN", "NOTIN"):
            return _requirement(key, ops[tok], self.set_values())
        return _requirement(key, ops[tok], self.exact_value())

    def set_values(self) -> list[str]:
        tok, lit = self.consume()
        if tok != "OPEN":
            raise SelectorError(f"found '{lit}' expected: '('")
        tok, lit = self.lookahead()
        if tok == "CLOSE":
            self.consume()
            return [""]
        if tok not in ("ID", "COMMA"):
            raise SelectorError(f"found '{lit}', expected: ',', ')' or identifier")
        values: set[str] = set()
        while True:
            tok, lit = self.consume()
            if tok == "ID":
                values.add(lit)
                tok2, lit2 = self.lookahead()
                if tok2 == "COMMA":
                    continue
                if tok2 == "CLOSE":
                    break
                raise SelectorError(f"found '{lit2}', expected: ',' or ')'")
            if tok == "COMMA":
                # "(,", ",)" and ",," stand for empty values.
                if not values:
                    values.add("")
                tok2, _ = self.lookahead()
                if tok2 == "CLOSE":
                    values.add("")
                    break
                if tok2 == "COMMA":
                    self.consume()
                    values.add("")
                continue
            raise SelectorError(f"found '{lit}', expected: ',', or identifier")
        tok, _ = self.consume()
        if tok != "CLOSE":
            raise SelectorError(f"found '{lit}', expected: ')'")
        return sorted(values)

    def exact_value(self) -> list[str]:
        tok, _ = self.lookahead()
        if tok in ("END", "COMMA"):
            return [""]
        tok, lit = self.consume()
        if tok == "ID":
            return [lit]
        raise SelectorError(f"found '{lit}', expected: identifier")


_INTEGER = re.compile(r"^[+-]?[0-9]+$")  # Go's strconv.ParseInt


def _quote(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _check_key(key: str, path: str) -> None:
    errs = is_qualified_name(key)
    if errs:
        raise SelectorError(f"{path}: Invalid value: {_quote(key)}: {'; '.join(errs)}")


def _requirement(key: str, op: str, values: list[str]) -> Requirement:
    """apimachinery's ``NewRequirement`` checks, with its field paths in the messages."""
    errs: list[str] = []
    if op in ("gt", "lt"):
        for i, v in enumerate(values):
            if not _INTEGER.match(v):
                errs.append(
                    f"values[{i}]: Invalid value: {_quote(v)}: for 'Gt', 'Lt' operators, the value must be an integer"
                )
    for i, v in enumerate(values):
        problems = is_valid_label_value(v)
        if problems:
            errs.append(f"values[{i}][{key}]: Invalid value: {_quote(v)}: {'; '.join(problems)}")
    if errs:
        raise SelectorError(errs[0] if len(errs) == 1 else "[" + ", ".join(errs) + "]")
    return Requirement(key, op, frozenset(values))


def parse_label_selector(text: str) -> LabelSelector:
    """Parse ``text`` (the ``labelSelector`` query syntax). Empty text selects everything."""
    if not isinstance(text, str):
        raise SelectorError(f"a label selector is a string, got {type(text).__name__}")
    if not text.strip():
        return LabelSelector((), "")
    return LabelSelector(tuple(_Parser(text).parse()), text)
