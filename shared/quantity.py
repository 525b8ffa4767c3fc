"""Kubernetes resource quantities (``500m``, ``1Gi``, ``1e3``) parsed to exact values.

Grammar (k8s.io/apimachinery ``resource.Quantity``)::

    quantity  ::= [+-] number suffix
    number    ::= digits | digits "." digits | digits "." | "." digits
    suffix    ::= binarySI | decimalSI | ("e" | "E") [+-] digits
    binarySI  ::= Ki | Mi | Gi | Ti | Pi | Ei
    decimalSI ::= n | u | m | "" | k | M | G | T | P | E

Values are :class:`fractions.Fraction`, so ``1Gi == 1024Mi`` and ``500m == 0.5`` hold exactly.
A YAML number (``cpu: 1``) is a quantity too; booleans are not.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exponent>[+-]?\d+)|(?P<decimal>[numkMGTPE]?))"
)
# Larger exponents are rejected rather than materialised as huge integers.
_MAX_EXPONENT = 1000


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""

    def __init__(self, text: object, reason: str = "not a Kubernetes quantity") -> None:
        self.text = text
        super().__init__(f"{reason}: {text!r}")


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Fraction:
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise QuantityError(text)
    number = Fraction(match.group("number"))
    if match.group("binary"):
        return number * _BINARY[match.group("binary")]
    exponent = match.group("exponent")
    if exponent is not None:
        power = int(exponent)
        if abs(power) > _MAX_EXPONENT:
            raise QuantityError(text, "quantity exponent out of range")
        return number * Fraction(10) ** power
    return number * _DECIMAL[match.group("decimal")]


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a quantity; :class:`QuantityError` (a ValueError) names the bad text."""
    if isinstance(value, bool):
        raise QuantityError(value, "a boolean is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise QuantityError(value)
        # Through repr: 0.1 means the decimal 0.1 a user wrote, not the nearest binary float.
        return Fraction(repr(value))
    if isinstance(value, str):
        return _parse_text(value)
    raise QuantityError(value, f"a {type(value).__name__} is not a quantity")


def try_parse_quantity(value: object) -> Fraction | None:
    """Like :func:`parse_quantity` but ``None`` for anything that is not a quantity."""
    try:
        return parse_quantity(value)  # type: ignore[arg-type]
    except QuantityError:
        return None


def is_quantity(value: object) -> bool:
    return try_parse_quantity(value) is not None


def quantities_equal(a: str | int | float, b: str | int | float) -> bool:
    """True when both parse and have the same value (``1Gi`` and ``1024Mi``)."""
    qa, qb = try_parse_quantity(a), try_parse_quantity(b)
    return qa is not None and qa == qb
