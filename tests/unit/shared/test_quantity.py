"""Kubernetes quantities parse to exact values; anything else is a ValueError naming the text."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from shared.quantity import QuantityError, is_quantity, parse_quantity, quantities_equal


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1", 1),
        ("1Ki", 1024),
        ("1Mi", 2**20),
        ("1Gi", 2**30),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("1.5Gi", 3 * 2**29),
        ("100n", Fraction(1, 10**7)),
        ("250u", Fraction(1, 4000)),
        ("500m", Fraction(1, 2)),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1.5e-3", Fraction(3, 2000)),
        ("2e+2", 200),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("0.1", Fraction(1, 10)),
        ("+1", 1),
        ("-2Ki", -2048),
        (1, 1),
        (0.5, Fraction(1, 2)),
        (0.1, Fraction(1, 10)),  # the decimal a user wrote, not the binary float
    ],
)
def test_valid_quantities(text: str | int | float, value: int | Fraction) -> None:
    assert parse_quantity(text) == value
    assert isinstance(parse_quantity(text), Fraction)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 1",
        "1 ",
        "Gi",
        "1gi",
        "1KB",
        "1KiB",
        "1.2.3",
        "1e",
        "1e3.5",
        "e3",
        "--1",
        "1,5",
        "0x10",
        "abc",
        "1Gi1",
        "1e9999",
    ],
)
def test_invalid_quantities_name_the_text(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_quantity(text)
    assert isinstance(info.value, QuantityError)
    assert repr(text) in str(info.value)
    assert not is_quantity(text)


@pytest.mark.parametrize("value", [True, False, None, [], {}, float("nan"), float("inf")])
def test_non_quantity_types(value: Any) -> None:  # deliberately outside parse_quantity's signature
    with pytest.raises(QuantityError):
        parse_quantity(value)


def test_equal_by_value() -> None:
    assert quantities_equal("1Gi", "1024Mi")
    assert quantities_equal("500m", "0.5")
    assert quantities_equal("1", 1)
    assert quantities_equal("1000m", 1.0)
    assert quantities_equal("1e3", "1k")
    assert not quantities_equal("1G", "1Gi")  # decimal and binary giga differ
    assert not quantities_equal("abc", "abc")  # not quantities at all
