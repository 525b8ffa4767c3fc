"""Canonical form of resource quantities, as the server re-encodes them in built-in objects.

A real apiserver decodes ``resources.requests.memory: 1024Mi`` into a Go ``resource.Quantity``
and writes back its canonical string (``1Gi``); ``0.5`` CPU becomes ``500m``. Drift detection
that compares strings breaks on this, so the emulator reproduces it. Pure functions.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {v: k for k, v in _DECIMAL.items()}
_BINARY_SUFFIX = {v: k for k, v in _BINARY.items()}


class QuantityError(ValueError):
    """Not a Kubernetes quantity (the server's message names the expected syntax)."""


def parse(text: str) -> tuple[Fraction, str]:
    """``(value, format)`` with format one of ``BinarySI``, ``DecimalSI``, ``DecimalExponent``."""
    m = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if not m or m.group(1) in (".", "+.", "-."):
        raise QuantityError(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    number, suffix = Fraction(m.group(1)), m.group(2)
    if suffix in _BINARY:
        return number * 1024 ** _BINARY[suffix], "BinarySI"
    if suffix in _DECIMAL:
        return number * Fraction(10) ** _DECIMAL[suffix], "DecimalSI"
    if suffix[:1] in ("e", "E"):
        try:
            return number * Fraction(10) ** int(suffix[1:]), "DecimalExponent"
        except ValueError:
            pass
    raise QuantityError("unable to parse quantity's suffix")


def _round_up_nano(value: Fraction) -> Fraction:
    scaled = value * 10**9
    return Fraction(math.ceil(scaled), 10**9) if value >= 0 else Fraction(-math.ceil(-scaled), 10**9)


def canonical(text: str | int | float) -> str:
    """The canonical string of a quantity (``1024Mi`` → ``1Gi``, ``0.5`` → ``500m``)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = repr(text) if isinstance(text, float) else str(text)
    value, fmt = parse(str(text))
    value = _round_up_nano(value)
    if value == 0:
        return "0"
    if fmt == "BinarySI" and (abs(value) < 1024 or value.denominator != 1):
        fmt = "DecimalSI"
    if fmt == "BinarySI":
        n, k = int(value), 0
        while n % 1024 == 0 and k < 6:
            n //= 1024
            k += 1
        return f"{n}{_BINARY_SUFFIX.get(k, '')}"
    # Decimal: the largest exponent (a multiple of 3) that leaves an integer mantissa.
    exp = -9
    mantissa = value * 10**9
    while mantissa.denominator == 1 and mantissa % 1000 == 0 and exp < 18:
        mantissa /= 1000
        exp += 3
    n = int(mantissa)
    if fmt == "DecimalExponent":
        return f"{n}e{exp}" if exp else str(n)
    return f"{n}{_DECIMAL_SUFFIX[exp]}"


def canonicalise_pod(pod: dict[str, Any]) -> list[str]:
    """Rewrite a pod's quantities in canonical form; returns the paths of invalid ones."""
    bad: list[str] = []
    spec = pod.get("spec") or {}

    def fix(mapping: object, path: str) -> None:
        if not isinstance(mapping, dict):
            return
        for k, v in list(mapping.items()):
            try:
                mapping[k] = canonical(v)
            except (QuantityError, TypeError, ValueError):
                bad.append(f"{path}[{k}]")

    for key in ("containers", "initContainers", "ephemeralContainers"):
        for i, c in enumerate(spec.get(key) or []):
            res = c.get("resources") if isinstance(c, dict) else None
            if isinstance(res, dict):
                fix(res.get("requests"), f"spec.{key}[{i}].resources.requests")
                fix(res.get("limits"), f"spec.{key}[{i}].resources.limits")
    fix(spec.get("overhead"), "spec.overhead")
    for i, v in enumerate(spec.get("volumes") or []):
        empty = v.get("emptyDir") if isinstance(v, dict) else None
        if isinstance(empty, dict) and "sizeLimit" in empty:
            holder = {"sizeLimit": empty["sizeLimit"]}
            fix(holder, f"spec.volumes[{i}].emptyDir")
            empty["sizeLimit"] = holder["sizeLimit"]
    return bad
