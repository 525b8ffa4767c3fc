"""Randomised cross-checks of semantic_equal / semantic_derivative against the slow canonical form.

``normalise`` is written independently of the fast comparators (it builds a canonical copy), so
agreement over thousands of generated trees - with empties added and dropped, quantities rewritten
and scalars changed - is strong evidence that the fast paths implement the documented rules.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from shared.semantic import normalise, semantic_derivative, semantic_equal

KEYS = ["resources", "limits", "requests", "overhead", "sizeLimit", "cpu", "memory", "image", "env", "value", "x", "y"]
SCALARS: list[Any] = [
    "1Gi",
    "1024Mi",
    "500m",
    "0.5",
    "1",
    "1.0",
    1,
    1.0,
    2,
    0,
    True,
    False,
    "",
    None,
    "a",
    "1000m",
    0.5,
]
EMPTIES: list[Any] = [None, [], {}, "", {"x": None}, {"y": [], "x": {}}]  # the last two are deep-empty maps
# Semantically interchangeable spellings, used to rewrite values without changing their meaning
# in quantity fields (and to change meaning everywhere else).
SPELLINGS = {"1Gi": "1024Mi", "1024Mi": "1Gi", "500m": "0.5", "0.5": "500m", "1": "1000m", "1000m": "1"}
# 1 and 1.0 are one dict key (equal hashes), so the int/float spelling swap is done by respell().


def respell(value: Any) -> Any:
    if isinstance(value, int | float) and value == 1:
        return 1.0 if isinstance(value, int) else 1
    return SPELLINGS[value]


def gen(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth >= 4 or roll < 0.35:
        return rng.choice(SCALARS)
    if roll < 0.7:
        return {rng.choice(KEYS): gen(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return [gen(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def mutate(rng: random.Random, tree: Any) -> Any:
    """A copy with a few random edits, most of which preserve meaning in some positions."""
    tree = copy.deepcopy(tree)

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            for k in list(node):
                roll = rng.random()
                if roll < 0.08:
                    del node[k]
                elif roll < 0.16:
                    node[k] = rng.choice(EMPTIES)
                else:
                    node[k] = walk(node[k])
            if rng.random() < 0.1:
                node[rng.choice(KEYS)] = rng.choice(EMPTIES + SCALARS)
            return node
        if isinstance(node, list):
            if rng.random() < 0.05:
                node.append(gen(rng, 3))
            return [walk(v) for v in node]
        roll = rng.random()
        if roll < 0.25 and not isinstance(node, bool) and node in SPELLINGS:
            return respell(node)
        if roll < 0.3:
            return rng.choice(SCALARS)
        return node

    return walk(tree)


def add_live_only_fields(rng: random.Random, tree: Any) -> Any:
    tree = copy.deepcopy(tree)

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            for k in list(node):
                node[k] = walk(node[k])
            if rng.random() < 0.3:
                node.setdefault("serverDefault" + str(rng.randint(0, 9)), gen(rng, 3))
            return node
        if isinstance(node, list):
            node = [walk(v) for v in node]
            if rng.random() < 0.3:
                node.append(gen(rng, 3))
            return node
        return node

    return walk(tree)


def subset(desired: Any, live: Any) -> bool:
    """Derivative on canonical forms (both already normalised)."""
    if desired is None:
        return True
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(subset(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) <= len(live)
            and all(subset(d, v) for d, v in zip(desired, live, strict=False))
        )
    same: bool = desired == live
    return same


def test_equal_agrees_with_canonical_form() -> None:
    rng = random.Random(20261129)
    verdicts = {True: 0, False: 0}
    for _ in range(3000):
        a = gen(rng)
        b = mutate(rng, a) if rng.random() < 0.8 else gen(rng)
        expected = normalise(a) == normalise(b)
        assert semantic_equal(a, b) is expected, (a, b)
        assert semantic_equal(b, a) is expected, (b, a)
        verdicts[expected] += 1
    # The generator must exercise both outcomes substantially, or this test proves little.
    assert min(verdicts.values()) > 500, verdicts


def test_derivative_agrees_with_canonical_subset() -> None:
    rng = random.Random(7)
    verdicts = {True: 0, False: 0}
    for _ in range(3000):
        desired = gen(rng)
        live = add_live_only_fields(rng, mutate(rng, desired) if rng.random() < 0.5 else desired)
        expected = subset(normalise(desired), normalise(live))
        assert semantic_derivative(desired, live) is expected, (desired, live)
        verdicts[expected] += 1
    assert min(verdicts.values()) > 300, verdicts


def test_equal_implies_derivative_both_ways() -> None:
    rng = random.Random(11)
    for _ in range(2000):
        a = gen(rng)
        b = mutate(rng, a)
        if semantic_equal(a, b):
            assert semantic_derivative(a, b) and semantic_derivative(b, a), (a, b)


def test_live_only_additions_never_count_as_drift() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        desired = gen(rng)
        assert semantic_derivative(desired, add_live_only_fields(rng, desired))
