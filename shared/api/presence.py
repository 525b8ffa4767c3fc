"""Which JSON fields a decoded object was given, so that encoding it gives back exactly its input.

msgspec's ``omit_defaults`` cannot tell "absent" from "written with the zero value": a user's
``labels: {}`` or ``minRunners: 0`` looks like the default, and a status struct that encodes every
field turns ``status: {}`` into a status full of zeros. So :func:`shared.api.decode` records, on
every struct it builds, the JSON names present in the input (:func:`mark`), and
:func:`shared.api.to_dict` / :func:`shared.api.encode` use that record (:func:`restore`):

* a field the input had is encoded, even when it holds the zero value (``{}``, ``[]``, ``""``,
  ``0``, ``null``);
* a field the input did not have is encoded only when its value differs from the default (so a
  value a worker set after decoding is still written);
* a struct built in Python (not decoded) has no record and follows its class rules: spec structs
  omit defaults, status structs encode every field.

The record lives in the instance ``__dict__`` (the API structs are declared with ``dict=True``),
so it never takes part in ``==``, ``repr`` or the CRD schema. ``copy.copy`` and ``copy.deepcopy``
keep it; ``msgspec.structs.replace`` builds a new struct and drops it.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import msgspec

_GIVEN = "_json_fields_given"


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, str, Any, Any], ...]:
    """(attribute, JSON name, default, default factory) of each field of a struct type."""
    return tuple((f.name, f.encode_name, f.default, f.default_factory) for f in msgspec.structs.fields(cls))


def _is_default(value: Any, default: Any, factory: Any) -> bool:
    if default is not msgspec.NODEFAULT:
        return bool(value is default or value == default)
    if factory is not msgspec.NODEFAULT:
        return bool(value == factory())
    return False  # a required field


def _structs_inside(value: Any) -> bool:
    """Whether a list/dict value holds structs (API maps and lists are homogeneous)."""
    if isinstance(value, list):
        return bool(value) and isinstance(value[0], msgspec.Struct)
    if isinstance(value, dict):
        return bool(value) and isinstance(next(iter(value.values())), msgspec.Struct)
    return False


def given(obj: msgspec.Struct) -> frozenset[str] | None:
    """The JSON names ``obj`` was decoded from, or None when it was not decoded."""
    state = getattr(obj, "__dict__", None)
    return state.get(_GIVEN) if state is not None else None


def mark(value: Any, tree: Any) -> None:
    """Record on every struct in ``value`` which fields the JSON ``tree`` it was decoded from had."""
    if isinstance(value, msgspec.Struct):
        if not isinstance(tree, dict):
            return
        state = getattr(value, "__dict__", None)
        fields = _fields(type(value))
        if state is not None:
            state[_GIVEN] = frozenset(name for _, name, _, _ in fields if name in tree)
        for attr, name, _, _ in fields:
            if name in tree:
                mark(getattr(value, attr), tree[name])
    elif _structs_inside(value):
        if isinstance(value, list) and isinstance(tree, list):
            for item, sub in zip(value, tree, strict=False):
                mark(item, sub)
        elif isinstance(value, dict) and isinstance(tree, dict):
            for key, item in value.items():
                mark(item, tree.get(key))


def to_builtins(value: Any) -> Any:
    """``msgspec.to_builtins`` that honours the records :func:`mark` left."""
    tree = msgspec.to_builtins(value)
    restore(value, tree)
    return tree


def restore(value: Any, tree: Any) -> None:
    """Fix up ``tree`` (``msgspec.to_builtins(value)``) in place so that every decoded struct
    encodes the fields it was given, and no default it was not given."""
    if isinstance(value, msgspec.Struct):
        if not isinstance(tree, dict):
            return
        record = given(value)
        fields = _fields(type(value))
        if record is not None:
            names = {name for _, name, _, _ in fields}
            out = {k: v for k, v in tree.items() if k not in names}  # the kind tag, if any
            for attr, name, default, factory in fields:
                item = getattr(value, attr)
                if name in tree:
                    if name in record or not _is_default(item, default, factory):
                        out[name] = tree[name]
                elif name in record and item is not msgspec.UNSET:
                    out[name] = msgspec.to_builtins(item)  # omitted as a default: put it back
            tree.clear()
            tree.update(out)
        for attr, name, _, _ in fields:
            if name in tree:
                restore(getattr(value, attr), tree[name])
    elif _structs_inside(value):
        if isinstance(value, list) and isinstance(tree, list):
            for item, sub in zip(value, tree, strict=False):
                restore(item, sub)
        elif isinstance(value, dict) and isinstance(tree, dict):
            for key, item in value.items():
                if key in tree:
                    restore(item, tree[key])


def copy_struct(self: Any) -> Any:
    """``__copy__`` for API structs: a shallow copy that keeps the decode record."""
    new = msgspec.structs.replace(self)
    _carry(self, new)
    return new


def deepcopy_struct(self: msgspec.Struct, memo: dict[int, Any]) -> Any:
    """``__deepcopy__`` for API structs: a deep copy that keeps the decode record."""
    new = msgspec.structs.replace(
        self, **{attr: copy.deepcopy(getattr(self, attr), memo) for attr, _, _, _ in _fields(type(self))}
    )
    memo[id(self)] = new
    _carry(self, new)
    return new


def _carry(old: Any, new: Any) -> None:
    state = getattr(old, "__dict__", None)
    if state:
        new.__dict__.update(state)
