"""Patch engines: RFC 6902 JSON patch, RFC 7386 merge patch, strategic merge patch. Pure functions.

Errors are raised as :class:`PatchError` (malformed patch → 400) or :class:`PatchFailed` (a valid
patch that cannot be applied → 422), which the handler turns into the server's Status bodies.
"""

from __future__ import annotations

from typing import Any

import msgspec

_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()


def _deepcopy(value: Any) -> Any:
    """JSON-data deep copy by a msgspec round trip (much faster than copy.deepcopy)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return _dec.decode(_enc.encode(value))


class PatchError(Exception):
    """The patch document itself is malformed (the server answers 400)."""


class PatchFailed(Exception):
    """The patch is well formed but cannot be applied to this object (the server answers 422)."""


# --- RFC 6902 -------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchFailed(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    cur = doc
    for p in parts[:-1]:
        if isinstance(cur, dict):
            if p not in cur:
                raise PatchFailed(f"doc is missing path: {p}")
            cur = cur[p]
        elif isinstance(cur, list):
            i = _index(p, len(cur), allow_end=False)
            cur = cur[i]
        else:
            raise PatchFailed(f"doc is missing path: {p}")
    return cur


def _index(token: str, length: int, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return length
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchFailed(f"invalid array index {token!r}")
    i = int(token)
    if i > length or (i == length and not allow_end):
        raise PatchFailed(f"array index {i} out of bounds")
    return i


def _get(doc: Any, parts: list[str]) -> Any:
    if not parts:
        return doc
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchFailed(f"missing value at /{'/'.join(parts)}")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(last, len(parent), allow_end=False)]
    raise PatchFailed(f"missing value at /{'/'.join(parts)}")


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), allow_end=True), value)
    else:
        raise PatchFailed("cannot add to a scalar")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        raise PatchFailed("cannot remove the document root")
    parent = _parent(doc, parts)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchFailed(f"unable to remove nonexistent key: {last}: missing value")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(last, len(parent), allow_end=False)]
    else:
        raise PatchFailed("cannot remove from a scalar")
    return doc


def validate_json_patch(ops: Any) -> list[dict[str, Any]]:
    """The server decodes a JSON patch strictly into a list of operations (400 otherwise)."""
    if not isinstance(ops, list):
        kind = "object" if isinstance(ops, dict) else type(ops).__name__
        raise PatchError(f"json: cannot unmarshal {kind} into Go value of type []handlers.jsonPatchOp")
    for op in ops:
        if not isinstance(op, dict):
            raise PatchError("json: cannot unmarshal array into Go value of type handlers.jsonPatchOp")
    if len(ops) > 10000:
        raise PatchError("The allowed maximum operations in a JSON patch is 10000, got " + str(len(ops)))
    return ops


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> Any:
    doc = _deepcopy(doc)
    for op in ops:
        name = op.get("op")
        path = op.get("path")
        if not isinstance(path, str):
            raise PatchFailed(f"operation {name!r} is missing path")
        parts = _pointer(path)
        if name == "add":
            if "value" not in op:
                raise PatchFailed("add operation does not apply: value is missing")
            doc = _add(doc, parts, _deepcopy(op["value"]))
        elif name == "remove":
            doc = _remove(doc, parts)
        elif name == "replace":
            if "value" not in op:
                raise PatchFailed("replace operation does not apply: value is missing")
            _get(doc, parts)
            if not parts:
                doc = _deepcopy(op["value"])
            else:
                parent = _parent(doc, parts)
                if isinstance(parent, dict):
                    parent[parts[-1]] = _deepcopy(op["value"])
                else:
                    parent[_index(parts[-1], len(parent), allow_end=False)] = _deepcopy(op["value"])
        elif name in ("move", "copy"):
            src = op.get("from")
            if not isinstance(src, str):
                raise PatchFailed(f"{name} operation is missing from")
            value = _deepcopy(_get(doc, _pointer(src)))
            if name == "move":
                doc = _remove(doc, _pointer(src))
            doc = _add(doc, parts, value)
        elif name == "test":
            if _get(doc, parts) != op.get("value"):
                raise PatchFailed(f"testing value {path} failed: test failed")
        else:
            raise PatchFailed(f"Unexpected kind: {name}")
    return doc


# --- RFC 7386 -------------------------------------------------------------------------------


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """JSON merge patch: objects merge recursively, ``null`` deletes, everything else replaces."""
    return _merge_into(_deepcopy(target), patch)


def _merge_into(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return _deepcopy(patch)
    result = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_into(result.get(key), value)
    return result


# --- strategic merge patch ------------------------------------------------------------------
#
# The table maps a field path (list elements written as ``[]``) to its patch strategy:
# ("merge", key) for lists merged by a key, ("merge", None) for scalar sets, and "retainKeys"
# flags. Paths not listed are atomic (lists replace). Sourced from the patch-strategy tags of
# k8s.io/api core/v1 and meta/v1.

MergeRule = tuple[str, "str | None"]

_CONTAINER_RULES: dict[str, MergeRule] = {
    "env": ("merge", "name"),
    "ports": ("merge", "containerPort"),
    "volumeMounts": ("merge", "mountPath"),
    "volumeDevices": ("merge", "devicePath"),
}

_POD_SPEC_RULES: dict[str, MergeRule] = {
    "containers": ("merge", "name"),
    "initContainers": ("merge", "name"),
    "ephemeralContainers": ("merge", "name"),
    "volumes": ("merge", "name"),
    "resourceClaims": ("merge", "name"),
    "imagePullSecrets": ("merge", "name"),
    "schedulingGates": ("merge", "name"),
    "hostAliases": ("merge", "ip"),
    "topologySpreadConstraints": ("merge", "topologyKey"),
}

_META_RULES: dict[str, MergeRule] = {
    "metadata.finalizers": ("merge", None),
    "metadata.ownerReferences": ("merge", "uid"),
}


def smp_rules_for(kind: str) -> dict[str, MergeRule]:
    """The merge rules of one built-in kind, as ``{path: rule}``."""
    rules = dict(_META_RULES)
    if kind == "Pod":
        for field, rule in _POD_SPEC_RULES.items():
            rules[f"spec.{field}"] = rule
        for clist in ("containers", "initContainers", "ephemeralContainers"):
            for field, rule in _CONTAINER_RULES.items():
                rules[f"spec.{clist}[].{field}"] = rule
        rules["status.conditions"] = ("merge", "type")
    elif kind == "ServiceAccount":
        rules["secrets"] = ("merge", "name")
    elif kind == "Namespace":
        rules["status.conditions"] = ("merge", "type")
    return rules


RETAIN_KEYS = {"spec.volumes[]"}

_KNOWN_DIRECTIVES = ("$patch", "$retainKeys")
_DIRECTIVE_PREFIXES = ("$setElementOrder/", "$deleteFromPrimitiveList/")


def apply_strategic_merge_patch(original: Any, patch: Any, rules: dict[str, MergeRule]) -> Any:
    if not isinstance(patch, dict):
        raise PatchError("strategic merge patch must be a JSON object")
    return _smp_map(_deepcopy(original) if isinstance(original, dict) else {}, patch, "", rules)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _smp_map(original: dict[str, Any], patch: dict[str, Any], path: str, rules: dict[str, MergeRule]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: _deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    if directive is not None:
        raise PatchError(f"Unknown patch type: {directive}")
    retain = patch.get("$retainKeys")
    for key in patch:
        if key.startswith("$") and key not in _KNOWN_DIRECTIVES and not key.startswith(_DIRECTIVE_PREFIXES):
            raise PatchError(f"unknown patch directive {key!r} at {path or 'the root'}")
    result = original
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        sub = _join(path, key)
        if value is None:
            result.pop(key, None)
            continue
        rule = rules.get(sub)
        current = result.get(key)
        if isinstance(value, dict):
            result[key] = _smp_map(current if isinstance(current, dict) else {}, value, sub, rules)
        elif isinstance(value, list) and rule and rule[0] == "merge":
            result[key] = _smp_list(current if isinstance(current, list) else [], value, sub, rule[1], rules)
        else:
            result[key] = _deepcopy(value)
    # $deleteFromPrimitiveList/<field>: remove scalars from a merge list.
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if not isinstance(value, list):
                raise PatchError(f"{key} must be a list")
            if isinstance(result.get(field), list):
                result[field] = [v for v in result[field] if v not in value]
                if not result[field]:
                    result.pop(field)
    for key, value in patch.items():
        if key.startswith("$setElementOrder/"):
            field = key.split("/", 1)[1]
            rule = rules.get(_join(path, field))
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = _reorder(result[field], value, rule[1] if rule else None)
    if retain is not None:
        if not isinstance(retain, list):
            raise PatchError("$retainKeys must be a list")
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _reorder(items: list[Any], order: list[Any], key: str | None) -> list[Any]:
    def ident(x: Any) -> Any:
        return x.get(key) if key and isinstance(x, dict) else x

    wanted = [ident(o) for o in order]
    ranked = sorted(
        enumerate(items), key=lambda p: wanted.index(ident(p[1])) if ident(p[1]) in wanted else len(wanted) + p[0]
    )
    return [x for _, x in ranked]


def _smp_list(
    original: list[Any], patch: list[Any], path: str, key: str | None, rules: dict[str, MergeRule]
) -> list[Any]:
    # A list-level {"$patch": "replace"} element replaces the whole list with the other elements.
    if any(isinstance(p, dict) and p.get("$patch") == "replace" and (key is None or key not in p) for p in patch):
        return [_deepcopy(p) for p in patch if not (isinstance(p, dict) and p.get("$patch") == "replace")]
    if key is None:  # a set of scalars: union, keeping the original order
        result = list(original)
        for v in patch:
            if isinstance(v, dict):
                raise PatchError(f"unexpected object in the primitive list {path}")
            if v not in result:
                result.append(v)
        return result
    result = [_deepcopy(x) for x in original]
    elem_path = path + "[]"
    for element in patch:
        if not isinstance(element, dict):
            raise PatchError(f"the list {path} is merged by {key!r}; each element must be an object")
        if key not in element:
            raise PatchError(f"map: {element} does not contain declared merge key: {key}")
        idx = next((i for i, x in enumerate(result) if isinstance(x, dict) and x.get(key) == element[key]), None)
        directive = element.get("$patch")
        if directive == "delete":
            if idx is not None:
                del result[idx]
            continue
        if idx is None:
            clean = {k: v for k, v in element.items() if k != "$patch"}
            result.append(_smp_map({}, clean, elem_path, rules))
        else:
            result[idx] = _smp_map(result[idx], element, elem_path, rules)
    return result
