"""Patch engines: RFC 6902 JSON patch, RFC 7386 merge patch, strategic merge patch. Pure functions.

Errors are raised as :class:`PatchError` (malformed patch → 400) or :class:`PatchFailed` (a valid
patch that cannot be applied → 422), which the handler turns into the server's Status bodies.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .errors import json_kind

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
        raise PatchError(f"json: cannot unmarshal {json_kind(ops)} into Go value of type []handlers.jsonPatchOp")
    for op in ops:
        if not isinstance(op, dict):
            raise PatchError(f"json: cannot unmarshal {json_kind(op)} into Go value of type handlers.jsonPatchOp")
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

_DIRECTIVE_PREFIXES = ("$setElementOrder/", "$deleteFromPrimitiveList/")


class PatchTypeError(Exception):
    """A ``$patch`` directive the server does not know (it answers 500, no reason)."""


def go_repr(value: Any) -> str:
    """Go's ``%v`` of decoded JSON: ``map[k:v ...]`` with sorted keys, ``[a b]``, ``<nil>``."""
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_repr(value[k])}" for k in sorted(value)) + "]"
    if isinstance(value, list):
        return "[" + " ".join(go_repr(v) for v in value) + "]"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def apply_strategic_merge_patch(original: Any, patch: Any, rules: dict[str, MergeRule]) -> Any:
    """Apply a strategic merge patch as apimachinery's ``strategicpatch`` does.

    Keyed lists and scalar sets merge, then the patch's items are interleaved with the items only
    the server had, each keeping its own order (``[a]`` patched with ``[b]`` is ``[b, a]``).
    Unknown ``$``-keys are ordinary keys; an unknown ``$patch`` value raises :class:`PatchTypeError`."""
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
        raise PatchTypeError(f"unknown patch type: {directive} in map: {go_repr(patch)}")
    retain = patch.get("$retainKeys")
    if retain is not None and not isinstance(retain, list):
        raise PatchError("invalid patch format of retainKeys")
    stored_lists = {k: v for k, v in original.items() if isinstance(v, list)}  # merges build new lists
    result = original
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith(_DIRECTIVE_PREFIXES):
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
    # $deleteFromPrimitiveList/<field>: remove scalars from a merge list (anything else is ignored).
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/") and isinstance(value, list):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list):
                result[field] = [v for v in result[field] if v not in value]
                if not result[field]:
                    result.pop(field)
    for key, value in patch.items():
        if key.startswith("$setElementOrder/"):
            field = key.split("/", 1)[1]
            rule = rules.get(_join(path, field))
            merged = result.get(field)
            if isinstance(merged, list) and isinstance(value, list):
                server = stored_lists.get(field) or []
                result[field] = _normalise_order(merged, value, server, rule[1] if rule else None)
    if retain is not None:
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _ident(item: Any, key: str | None) -> Any:
    if key is None:
        return item if not isinstance(item, (dict, list)) else _enc.encode(item)
    return item.get(key) if isinstance(item, dict) else None


def _normalise_order(merged: list[Any], order: list[Any], server_order: list[Any], key: str | None) -> list[Any]:
    """apimachinery's ``normalizeElementOrder``: the items named in ``order`` in that order,
    interleaved with the others (kept in their stored order) by their position in
    ``server_order``."""
    wanted = [_ident(o, key) for o in order]
    listed = [m for m in merged if _ident(m, key) in wanted]
    listed.sort(key=lambda m: wanted.index(_ident(m, key)))
    others = [m for m in merged if _ident(m, key) not in wanted]
    server = [_ident(o, key) for o in server_order]

    def position(item: Any) -> int:
        ident = _ident(item, key)
        return server.index(ident) if ident in server else -1

    out: list[Any] = []
    i = j = 0
    while i < len(others) or j < len(listed):
        if j >= len(listed):
            out.append(others[i])
            i += 1
        elif i >= len(others):
            out.append(listed[j])
            j += 1
        else:
            left, right = position(others[i]), position(listed[j])
            if left >= 0 and right >= 0 and left < right:
                out.append(others[i])
                i += 1
            else:
                out.append(listed[j])
                j += 1
    return out


def _smp_list(
    original: list[Any], patch: list[Any], path: str, key: str | None, rules: dict[str, MergeRule]
) -> list[Any]:
    # A list-level {"$patch": "replace"} element replaces the whole list with the other elements.
    if any(isinstance(p, dict) and p.get("$patch") == "replace" and (key is None or key not in p) for p in patch):
        return [_deepcopy(p) for p in patch if not (isinstance(p, dict) and p.get("$patch") == "replace")]
    if key is None:  # a set of scalars: union without duplicates
        merged: list[Any] = []
        for v in list(original) + list(patch):
            if isinstance(v, dict):
                raise PatchError(f"unexpected object in the primitive list {path}")
            if v not in merged:
                merged.append(_deepcopy(v))
        return _normalise_order(merged, patch, original, None)
    merged = [_deepcopy(x) for x in original]
    kept_patch: list[Any] = []
    elem_path = path + "[]"
    for element in patch:
        if not isinstance(element, dict):
            raise PatchError(f"the list {path} is merged by {key!r}; each element must be an object")
        if key not in element:
            raise PatchError(f"map: {go_repr(element)} does not contain declared merge key: {key}")
        idx = next((i for i, x in enumerate(merged) if isinstance(x, dict) and x.get(key) == element[key]), None)
        directive = element.get("$patch")
        if directive == "delete":
            if idx is not None:
                del merged[idx]
            continue
        kept_patch.append(element)
        if idx is None:
            clean = {k: v for k, v in element.items() if k != "$patch"}
            merged.append(_smp_map({}, clean, elem_path, rules))
        else:
            merged[idx] = _smp_map(merged[idx], element, elem_path, rules)
    return _normalise_order(merged, kept_patch, original, key)


# --- server-side apply (the merge part) ----------------------------------------------------------


def apply_configuration(
    live: dict[str, Any], applied: dict[str, Any], rules: dict[str, MergeRule], schema: dict[str, Any] | None
) -> dict[str, Any]:
    """Merge an applied configuration into the live object, as server-side apply merges it when
    one manager owns everything: maps merge recursively, lists merge by their merge keys (built-in
    kinds' strategic-merge keys; ``x-kubernetes-list-type: map|set`` for custom resources), other
    lists and scalars are replaced, and ``null`` removes a field."""
    return _apply_map(_deepcopy(live), applied, "", rules, schema)


def _schema_child(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if not schema:
        return None
    props = schema.get("properties") or {}
    child = props.get(key)
    if isinstance(child, dict):
        return child
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _list_rule(path: str, rules: dict[str, MergeRule], schema: dict[str, Any] | None) -> tuple[str, list[str]]:
    """``("map", keys)``, ``("set", [])`` or ``("atomic", [])`` for the list at ``path``."""
    if schema is not None:
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "map":
            return "map", list(schema.get("x-kubernetes-list-map-keys") or [])
        if list_type == "set":
            return "set", []
    rule = rules.get(path)
    if rule and rule[0] == "merge":
        return ("map", [rule[1]]) if rule[1] else ("set", [])
    return "atomic", []


def _apply_map(
    live: dict[str, Any], applied: dict[str, Any], path: str, rules: dict[str, MergeRule], schema: dict[str, Any] | None
) -> dict[str, Any]:
    for key, value in applied.items():
        sub = _join(path, key)
        child = _schema_child(schema, key)
        if value is None:
            live.pop(key, None)
        elif isinstance(value, dict) and isinstance(live.get(key), dict):
            live[key] = _apply_map(live[key], value, sub, rules, child)
        elif isinstance(value, list) and isinstance(live.get(key), list):
            live[key] = _apply_list(live[key], value, sub, rules, child)
        else:
            live[key] = _deepcopy(value)
    return live


def _apply_list(
    live: list[Any], applied: list[Any], path: str, rules: dict[str, MergeRule], schema: dict[str, Any] | None
) -> list[Any]:
    kind, keys = _list_rule(path, rules, schema)
    items = (schema or {}).get("items") if schema else None
    if kind == "set":
        merged = list(live) + [_deepcopy(v) for v in applied if v not in live]
        return _normalise_order(merged, applied, live, None)
    if kind != "map" or not keys or not all(isinstance(v, dict) for v in live + applied):
        return [_deepcopy(v) for v in applied]

    def ident(item: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(item.get(k) for k in keys)

    merged = [_deepcopy(v) for v in live]
    for element in applied:
        idx = next((i for i, x in enumerate(merged) if ident(x) == ident(element)), None)
        if idx is None:
            merged.append(_deepcopy(element))
        else:
            merged[idx] = _apply_map(merged[idx], element, path + "[]", rules, items)
    if len(keys) == 1:
        return _normalise_order(merged, applied, live, keys[0])
    return merged
