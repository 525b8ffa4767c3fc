"""Unknown-field pruning for built-in kinds, driven by kubernetes-asyncio's generated models.

A real server decodes built-in objects into Go structs, so fields it does not know vanish (with a
``Warning`` header, or a 400 under ``fieldValidation=Strict``). The generated client models carry
the same field tables (``attribute_map`` JSON names, ``openapi_types`` nested types), which makes
them a complete schema of every built-in kind. Pure functions; models are only inspected.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from kubernetes_asyncio.client import models

MODEL_FOR_KIND: dict[tuple[str, str], str] = {
    ("", "Pod"): "V1Pod",
    ("", "ConfigMap"): "V1ConfigMap",
    ("", "Secret"): "V1Secret",
    ("", "ServiceAccount"): "V1ServiceAccount",
    ("", "Namespace"): "V1Namespace",
    ("", "Node"): "V1Node",
    ("", "Event"): "CoreV1Event",
    ("events.k8s.io", "Event"): "EventsV1Event",
    ("rbac.authorization.k8s.io", "Role"): "V1Role",
    ("rbac.authorization.k8s.io", "RoleBinding"): "V1RoleBinding",
    ("coordination.k8s.io", "Lease"): "V1Lease",
    ("scheduling.k8s.io", "PriorityClass"): "V1PriorityClass",
    # CustomResourceDefinition is not pruned: JSONSchemaProps holds free-form parts (default, enum).
}

_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict\(str, (.+)\)$")


@cache
def _fields(model_name: str) -> dict[str, str] | None:
    """JSON field name → type string of one model, or None if the type is not a model."""
    cls = getattr(models, model_name, None)
    if cls is None or not hasattr(cls, "attribute_map"):
        return None
    return {json_name: cls.openapi_types[attr] for attr, json_name in cls.attribute_map.items()}


@cache
def _shape(type_name: str) -> tuple[str, Any]:
    """What a type string is: ("list" | "dict", element type), ("model", its fields) or ("leaf", None)."""
    m = _LIST.match(type_name)
    if m:
        return "list", m.group(1)
    m = _DICT.match(type_name)
    if m:
        return "dict", m.group(1)
    fields = _fields(type_name)
    return ("leaf", None) if fields is None else ("model", fields)


_ABSENT: Any = object()


def _prune(value: Any, type_name: str, path: str, pruned: list[str], old: Any = _ABSENT) -> Any:
    # Called for every field of every built-in write: the type's shape is parsed once (cached),
    # and a leaf value is kept without building its path. ``old`` is the same value in the stored
    # object (on an update): a stored value holds no unknown field (it was pruned when written and
    # built-in types never change), so a part equal to it is kept without walking it (issue 10: a
    # status update re-walked the unchanged spec of every pod).
    shape, arg = _shape(type_name)
    if shape == "leaf":
        return value  # scalars, `object`, quantities, int-or-string, times
    if shape == "list":
        if isinstance(value, list) and _shape(arg)[0] != "leaf":
            old_items: list[Any] = old if isinstance(old, list) else []
            n = len(old_items)
            return [
                v if i < n and v is not old_items[i] and v == old_items[i] else _prune(v, arg, f"{path}[{i}]", pruned)
                for i, v in enumerate(value)
            ]
        return list(value) if isinstance(value, list) else value
    if shape == "dict":
        if isinstance(value, dict) and _shape(arg)[0] != "leaf":
            return {k: _prune(v, arg, f"{path}[{k}]", pruned) for k, v in value.items()}
        return dict(value) if isinstance(value, dict) else value
    if not isinstance(value, dict):
        return value
    fields: dict[str, str] = arg
    old_fields: dict[str, Any] = old if isinstance(old, dict) else {}
    out = {}
    for k, v in value.items():
        t = fields.get(k)
        if t is None:
            pruned.append(f"{path}.{k}" if path else k)
        elif _shape(t)[0] == "leaf":
            out[k] = v
        else:
            ov = old_fields.get(k, _ABSENT)
            if ov is not _ABSENT and v is not ov and v == ov:
                out[k] = v
            else:
                out[k] = _prune(v, t, f"{path}.{k}" if path else k, pruned, ov)
    return out


def prune_builtin(
    group: str, kind: str, obj: dict[str, Any], old: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """``(object without unknown fields, pruned field paths)`` for a built-in kind; ``old``, the
    stored object on an update, spares walking the parts that did not change."""
    model = MODEL_FOR_KIND.get((group, kind))
    if model is None:
        return obj, []
    pruned: list[str] = []
    return _prune(obj, model, "", pruned, _ABSENT if old is None else old), pruned


def prune_object_meta(meta: dict[str, Any], pruned: list[str]) -> dict[str, Any]:
    """Drop unknown ``metadata`` fields (custom resources decode metadata as ObjectMeta too)."""
    kept: dict[str, Any] = _prune(meta, "V1ObjectMeta", "metadata", pruned)
    return kept
