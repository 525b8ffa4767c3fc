"""Semantic comparison of JSON trees (pod templates, runner specs), as Kubernetes means "the same".

Two questions, two functions:

* :func:`semantic_equal` — "did the runner spec change?" (the scale-set worker bumps
  ``actionableRevision`` only when this is False). Absent, ``null`` and empty (``[]``, ``{}``,
  ``""``) are the same thing, because a server drops empty collections on write and a spec read
  back must not look changed. Quantities compare by value.
* :func:`semantic_derivative` — "has the live listener pod drifted from the desired one?". Only
  what ``desired`` sets is compared: the server, the scheduler and admission add fields (nodeName,
  dnsPolicy, tolerations, the kube-api-access volume, ...) that must not count as drift.

Rules shared by both:

* Quantities compare by value (``1Gi == 1024Mi``, ``500m == 0.5``, ``cpu: 1 == "1000m"``) only in
  fields that *are* quantities: values of ``resources.limits``/``resources.requests`` and of
  ``overhead``, and ``sizeLimit``/``divisor``. Everywhere else strings compare exactly: an image
  tag ``"1"`` is not ``"1.0"`` and an env value ``"1Gi"`` is not ``"1024Mi"`` (the program reading
  it sees different text), even though both parse as quantities.
* Numbers compare by value, so ``1 == 1.0``: a JSON number written as ``1.0`` reads back from the
  API server as ``1`` (Go decodes untyped JSON numbers and re-encodes whole floats without the
  fraction), so telling them apart would report drift that no user made.
* Booleans are never numbers: ``True != 1`` (Python's ``==`` says otherwise; we do not).
* Values of different JSON types differ (``"1" != 1``) except in quantity fields.
* Lists compare pairwise, in order; no comparison raises on any JSON tree.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import msgspec

from shared.quantity import try_parse_quantity

_PLAIN, _QUANTITY, _QUANTITY_MAP = 0, 1, 2
_QUANTITY_MAP_KEYS_UNDER_RESOURCES = frozenset(("limits", "requests"))
_QUANTITY_VALUE_KEYS = frozenset(("sizeLimit", "divisor"))
_SPECIAL_KEYS = _QUANTITY_MAP_KEYS_UNDER_RESOURCES | _QUANTITY_VALUE_KEYS | {"overhead"}
_NUMBER_TYPES = (int, float)

_canonical = msgspec.json.Encoder(order="sorted")


def _child_mode(mode: int, parent_key: str | None, key: str) -> int:
    """Whether the value under ``key`` (in a map found under ``parent_key``) is a quantity."""
    if mode == _QUANTITY_MAP:
        return _QUANTITY
    if key in _QUANTITY_MAP_KEYS_UNDER_RESOURCES and parent_key == "resources":
        return _QUANTITY_MAP
    if key == "overhead":
        return _QUANTITY_MAP
    if key in _QUANTITY_VALUE_KEYS:
        return _QUANTITY
    return _PLAIN


def is_empty(value: Any) -> bool:
    """Absent, null, ``""``, ``[]`` and ``{}`` are all "not set"."""
    return value is None or (type(value) in (str, list, dict) and not value)


def _deep_empty(value: Any) -> bool:
    """Empty, or a map whose every value is (recursively) empty: ``{"env": [], "x": None}``."""
    if is_empty(value):
        return True
    return type(value) is dict and all(_deep_empty(v) for v in value.values())


def _scalar_equal(a: Any, b: Any, mode: int) -> bool:
    ta, tb = type(a), type(b)
    if mode == _QUANTITY and ta is not bool and tb is not bool:
        qa, qb = try_parse_quantity(a), try_parse_quantity(b)
        if qa is not None and qb is not None:
            return qa == qb
    if ta is bool or tb is bool:
        return ta is tb and a == b
    if ta in _NUMBER_TYPES and tb in _NUMBER_TYPES:
        return bool(a == b)
    return ta is tb and a == b


def _mode_for(mode: int, parent_key: str | None, key: str) -> int:
    # Inlined fast case of _child_mode: almost every key is plain.
    if mode or key in _SPECIAL_KEYS:
        return _child_mode(mode, parent_key, key)
    return _PLAIN


def _equal(a: Any, b: Any, key: str | None, mode: int, trail: list[Any] | None) -> bool:
    # Hot loop: same-type equal scalars are accepted inline, without a call per leaf.
    if a is b:
        return True
    ta, tb = type(a), type(b)
    if ta is dict:
        if tb is not dict:
            return is_empty(b) and _deep_empty(a)
        for k, va in a.items():
            vb = b.get(k)
            if va is vb:
                continue
            tva = type(va)
            if tva is type(vb) and va == vb and ((tva is not dict and tva is not list) or _same_json(va, vb)):
                continue
            if not _equal(va, vb, k, _mode_for(mode, key, k), trail):
                if trail is not None:
                    trail.append(k)
                return False
        for k, vb in b.items():
            if k not in a and not _deep_empty(vb):
                if trail is not None:
                    trail.append(k)
                return False
        return True
    if ta is list:
        if tb is not list:
            return not a and _deep_empty(b)
        if len(a) != len(b):
            return False
        for i, (va, vb) in enumerate(zip(a, b, strict=True)):
            if va is vb:
                continue
            tva = type(va)
            if tva is type(vb) and va == vb and ((tva is not dict and tva is not list) or _same_json(va, vb)):
                continue
            if not _equal(va, vb, key, _PLAIN, trail):
                if trail is not None:
                    trail.append(i)
                return False
        return True
    if a is None or (ta is str and not a):
        return _deep_empty(b)
    if b is None or tb is dict or tb is list or (tb is str and not b):
        return False
    return _scalar_equal(a, b, mode)


def _derivative(desired: Any, live: Any, key: str | None, mode: int, trail: list[Any] | None) -> bool:
    if desired is live:
        return True
    td, tl = type(desired), type(live)
    if td is dict:
        if tl is not dict:
            return _deep_empty(desired)
        for k, vd in desired.items():
            vl = live.get(k)
            if vd is vl:
                continue
            tvd = type(vd)
            if tvd is type(vl) and vd == vl and ((tvd is not dict and tvd is not list) or _same_json(vd, vl)):
                continue
            if not _derivative(vd, vl, k, _mode_for(mode, key, k), trail):
                if trail is not None:
                    trail.append(k)
                return False
        return True
    if td is list:
        if not desired:
            return True
        # Longer desired is drift; extra live elements (appended by admission) are not.
        if tl is not list or len(desired) > len(live):
            return False
        for i, (vd, vl) in enumerate(zip(desired, live, strict=False)):  # live may have more
            if vd is vl:
                continue
            tvd = type(vd)
            if tvd is type(vl) and vd == vl and ((tvd is not dict and tvd is not list) or _same_json(vd, vl)):
                continue
            if not _derivative(vd, vl, key, _PLAIN, trail):
                if trail is not None:
                    trail.append(i)
                return False
        return True
    if desired is None or (td is str and not desired):
        return True
    if live is None or tl is dict or tl is list or (tl is str and not live):
        return False
    return _scalar_equal(desired, live, mode)


def _same_json(a: Any, b: Any) -> bool:
    """For two trees Python already calls equal: are they the same JSON (``true`` is not ``1``)?

    Used to skip whole identical subtrees at C speed instead of walking them in Python.
    """
    try:
        return _canonical.encode(a) == _canonical.encode(b)
    except (TypeError, ValueError, msgspec.EncodeError):
        return False


def _identical(a: Any, b: Any) -> bool:
    """Cheap sufficient test for "semantically equal": structurally identical trees.

    Python's ``==`` runs in C and fails fast on most differences; :func:`_same_json` then rules out
    the one thing it gets wrong for JSON (``True == 1``).
    """
    return a == b and _same_json(a, b)


def _tree(value: Any) -> Any:
    # Structs (e.g. an EphemeralRunnerSpec) compare as the JSON they encode to.
    return msgspec.to_builtins(value) if isinstance(value, msgspec.Struct) else value


def semantic_equal(a: Any, b: Any) -> bool:
    """True when the JSON trees (or API structs) ``a`` and ``b`` mean the same object (see module doc)."""
    a, b = _tree(a), _tree(b)
    if a is b or _identical(a, b):
        return True
    return _equal(a, b, None, _PLAIN, None)


def semantic_derivative(desired: Any, live: Any) -> bool:
    """True when every non-empty field ``desired`` sets has the same meaning in ``live``.

    Fields only ``live`` has are ignored; so are empty fields of ``desired`` (the price: removing a
    field from ``desired`` is invisible here). A list longer in ``desired`` than in ``live`` is drift;
    elements compare pairwise from the start.
    """
    desired, live = _tree(desired), _tree(live)
    if desired is live or _identical(desired, live):
        return True
    return _derivative(desired, live, None, _PLAIN, None)


def _format_path(trail: list[Any]) -> str:
    path = "$"
    for step in reversed(trail):
        path += f"[{step}]" if isinstance(step, int) else f".{step}"
    return path


def first_difference(a: Any, b: Any) -> str | None:
    """JSON path of the first field where ``a`` and ``b`` differ semantically; None if equal.

    For log lines and Events that explain *why* a revision was bumped.
    """
    trail: list[Any] = []
    return None if _equal(_tree(a), _tree(b), None, _PLAIN, trail) else _format_path(trail)


def first_drift(desired: Any, live: Any) -> str | None:
    """JSON path of the first field of ``desired`` that ``live`` does not carry; None if no drift."""
    trail: list[Any] = []
    return None if _derivative(_tree(desired), _tree(live), None, _PLAIN, trail) else _format_path(trail)


def container_port_counts_differ(desired_pod_spec: Any, live_pod_spec: Any) -> bool:
    """True when a container's number of ports differs between desired and live pod specs.

    :func:`semantic_derivative` cannot see a port that ``desired`` stopped setting (e.g. metrics
    turned off), so the listener-pod worker checks this too. Counts only: the server defaults each
    port's ``protocol`` to TCP, so comparing contents would report drift on every healthy pod.
    """

    def counts(spec: Any) -> dict[str, int]:
        containers = spec.get("containers") if isinstance(spec, dict) else None
        result: dict[str, int] = {}
        for container in containers or ():
            if isinstance(container, dict):
                ports = container.get("ports")
                result[str(container.get("name", ""))] = len(ports) if isinstance(ports, list) else 0
        return result

    desired, live = counts(desired_pod_spec), counts(live_pod_spec)
    return any(live.get(name, 0) != n for name, n in desired.items())


# --- canonical form ------------------------------------------------------------------------------


class _Bool:
    """A boolean that never equals a number (Python's True == 1 would)."""

    __slots__ = ("value",)

    def __init__(self, value: bool) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Bool) and other.value is self.value

    def __hash__(self) -> int:
        return hash((_Bool, self.value))

    def __repr__(self) -> str:
        return f"_Bool({self.value})"


def _normalise(value: Any, key: str | None, mode: int) -> Any:
    if is_empty(value):
        return None
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            n = _normalise(v, k, _child_mode(mode, key, k))
            if n is not None:
                out[k] = n
        return out or None
    if isinstance(value, list):
        return [_normalise(v, key, _PLAIN) for v in value]
    if isinstance(value, bool):
        return _Bool(value)
    if mode == _QUANTITY:
        quantity = try_parse_quantity(value)
        if quantity is not None:
            return ("quantity", quantity)
    if isinstance(value, float) and value.is_integer():
        return Fraction(int(value))
    return value


def normalise(tree: Any) -> Any:
    """A canonical form: ``semantic_equal(a, b) == (normalise(a) == normalise(b))``.

    Empties are dropped, quantity fields become exact values, booleans are kept apart from numbers.
    Slower than :func:`semantic_equal` (it allocates a full copy); the benchmark's baseline.
    """
    return _normalise(tree, None, _PLAIN)
