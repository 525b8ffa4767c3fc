"""Structural-schema handling of custom resources: pruning, defaulting, validation. Pure functions.

Follows the CRD rules: unknown fields are dropped unless ``x-kubernetes-preserve-unknown-fields``
is set at that level (``apiVersion``/``kind``/``metadata`` are kept at the root); a ``default`` is
applied when a key is missing (or null and not nullable) but never creates an absent parent;
validation reports every problem as a field cause with the server's wording.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from .errors import Cause, invalid_value

Schema = dict[str, Any]


def _is_preserve(schema: Schema) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields"))


def prune(value: Any, schema: Schema | None, path: str, root: bool, pruned: list[str]) -> Any:
    """Return ``value`` without the fields its schema does not declare; collect pruned paths."""
    if schema is None or (_is_preserve(schema) and not schema.get("properties")):
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        addl = schema.get("additionalProperties")
        preserve = _is_preserve(schema)
        embedded = root or bool(schema.get("x-kubernetes-embedded-resource"))
        out: dict[str, Any] = {}
        for k, v in value.items():
            sub_path = f"{path}.{k}" if path else k
            sub_schema = (
                props.get(k) if props is not None and k in props else (addl if isinstance(addl, dict) else None)
            )
            if v is None and isinstance(sub_schema, dict) and not sub_schema.get("nullable"):
                continue  # null in a non-nullable field is dropped (then defaulted), not an error
            if embedded and k in ("apiVersion", "kind", "metadata"):
                out[k] = v
            elif props is not None and k in props:
                out[k] = prune(v, props[k], sub_path, False, pruned)
            elif isinstance(addl, dict):
                out[k] = prune(v, addl, sub_path, False, pruned)
            elif addl is True or preserve or (props is None and addl is None and schema.get("type") != "object"):
                out[k] = v
            else:
                pruned.append(sub_path)
        return out
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            return [prune(v, items, f"{path}[{i}]", False, pruned) for i, v in enumerate(value)]
    return value


def apply_defaults(value: Any, schema: Schema | None) -> Any:
    if schema is None:
        return value
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for k, sub in props.items():
            if not isinstance(sub, dict):
                continue
            if "default" in sub and (k not in value or (value[k] is None and not sub.get("nullable"))):
                value[k] = copy.deepcopy(sub["default"])
            if k in value:
                value[k] = apply_defaults(value[k], sub)
        addl = schema.get("additionalProperties")
        if isinstance(addl, dict):
            for k in list(value):
                if k not in props:
                    value[k] = apply_defaults(value[k], addl)
        return value
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(v, schema["items"]) for v in value]
    return value


_GO_TYPE = {
    "object": "object",
    "array": "array",
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


class _Missing:
    """No correlated old value: a create, or a node that did not exist before the update."""


MISSING: Any = _Missing()


def validate(value: Any, schema: Schema | None, path: str, causes: list[Cause], old: Any = MISSING) -> None:
    """Collect validation failures (types, required, enum, bounds, pattern, lengths).

    ``old`` is the correlated stored value on an update. Validation *ratchets* as the real server
    does (CRDValidationRatcheting, GA in 1.33): a node equal to its old value reports nothing, so
    a write never fails over stored values it did not change (e.g. after a schema was tightened).
    Objects correlate by property; list items only in ``x-kubernetes-list-type: map`` (by key) or
    ``set`` lists: an atomic list correlates as a whole.
    """
    if schema is None:
        return
    if old is not MISSING and value == old:
        return
    t = schema.get("type")
    if value is None:
        if schema.get("nullable") or t is None:
            return
        causes.append(
            Cause("FieldValueTypeInvalid", f'Invalid value: "null": {path} in body must be of type {t}: "null"', path)
        )
        return
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            causes.append(
                Cause(
                    "FieldValueTypeInvalid",
                    f'Invalid value: "{_json_type(value)}": {path} in body must be of type integer-or-string',
                    path,
                )
            )
        return
    actual = _json_type(value)
    if t and t in _GO_TYPE:
        ok = actual == t or (t == "number" and actual == "integer")
        if not ok:
            causes.append(
                Cause(
                    "FieldValueTypeInvalid",
                    f'Invalid value: "{actual}": {path} in body must be of type {t}: "{actual}"',
                    path,
                )
            )
            return
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(f'"{e}"' if isinstance(e, str) else str(e) for e in schema["enum"])
        causes.append(
            Cause("FieldValueNotSupported", f"Unsupported value: {_show(value)}: supported values: {allowed}", path)
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    invalid_value(value, f"{path} in body should be greater than or equal to {schema['minimum']}"),
                    path,
                )
            )
        if "maximum" in schema and value > schema["maximum"]:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    invalid_value(value, f"{path} in body should be less than or equal to {schema['maximum']}"),
                    path,
                )
            )
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            causes.append(
                Cause("FieldValueTooLong", f"Too long: may not be more than {schema['maxLength']} bytes", path)
            )
        if "minLength" in schema and len(value) < schema["minLength"]:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    invalid_value(value, f"{path} in body should be at least {schema['minLength']} chars long"),
                    path,
                )
            )
        if "pattern" in schema and not re.search(schema["pattern"], value):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    invalid_value(value, f"{path} in body should match '{schema['pattern']}'"),
                    path,
                )
            )
    if isinstance(value, dict):
        for req in schema.get("required") or []:
            if req not in value:
                causes.append(Cause("FieldValueRequired", "Required value", f"{path}.{req}" if path else req))
        props = schema.get("properties") or {}
        addl = schema.get("additionalProperties")
        old_map = old if isinstance(old, dict) else {}
        for k, v in value.items():
            sub_path = f"{path}.{k}" if path else k
            old_v = old_map.get(k, MISSING)
            if k in props:
                validate(v, props[k], sub_path, causes, old_v)
            elif isinstance(addl, dict):
                validate(v, addl, sub_path, causes, old_v)
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            causes.append(
                Cause(
                    "FieldValueTooMany",
                    f"Too many: {len(value)}: must have at most {schema['maxProperties']} items",
                    path,
                )
            )
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            causes.append(
                Cause(
                    "FieldValueTooMany", f"Too many: {len(value)}: must have at most {schema['maxItems']} items", path
                )
            )
        if "minItems" in schema and len(value) < schema["minItems"]:
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    invalid_value(len(value), f"{path} in body should have at least {schema['minItems']} items"),
                    path,
                )
            )
        items = schema.get("items")
        if isinstance(items, dict):
            for i, v in enumerate(value):
                validate(v, items, f"{path}[{i}]", causes, _correlated_item(schema, v, old))


def _correlated_item(schema: Schema, item: Any, old: Any) -> Any:
    """The old list item ``item`` corresponds to: by key in a map list, by value in a set."""
    if not isinstance(old, list):
        return MISSING
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set":
        return item if item in old else MISSING
    keys = schema.get("x-kubernetes-list-map-keys") or []
    if list_type == "map" and keys and isinstance(item, dict):
        for candidate in old:
            if isinstance(candidate, dict) and all(candidate.get(k) == item.get(k) for k in keys):
                return candidate
    return MISSING


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def process_custom_object(
    obj: dict[str, Any], schema: Schema | None, old: dict[str, Any] | None = None, status_only: bool = False
) -> tuple[dict[str, Any], list[str], list[Cause]]:
    """Prune, default and validate one custom object: ``(object, pruned paths, causes)``.

    ``old`` (the stored object, on an update) makes validation ratchet. ``status_only`` is a
    write to the status subresource: the real server validates the status against its own
    schema there, so messages name paths relative to ``status`` while causes keep the full path.
    """
    pruned: list[str] = []
    if schema is None:
        return obj, pruned, []
    out = prune(obj, schema, "", True, pruned)
    out = apply_defaults(out, _without_meta(schema))
    causes: list[Cause] = []
    if status_only:
        if "status" in out:
            status_schema = (schema.get("properties") or {}).get("status")
            old_status = old.get("status", MISSING) if old is not None else MISSING
            validate(out["status"], status_schema, "", causes, old_status)
            causes = [Cause(c.reason, c.message, f"status.{c.field}" if c.field else "status") for c in causes]
        return out, pruned, causes
    body = {k: v for k, v in out.items() if k not in ("apiVersion", "kind", "metadata")}
    old_body = (
        {k: v for k, v in old.items() if k not in ("apiVersion", "kind", "metadata")} if old is not None else MISSING
    )
    validate(body, _without_meta(schema), "", causes, old_body)
    # A structural schema may restrict metadata.name and metadata.generateName (nothing else there).
    meta_props = ((schema.get("properties") or {}).get("metadata") or {}).get("properties") or {}
    meta = out.get("metadata") if isinstance(out.get("metadata"), dict) else {}
    old_meta = (old.get("metadata") or {}) if old is not None else {}
    for field in ("name", "generateName"):
        if field in meta_props and field in meta:
            validate(meta[field], meta_props[field], f"metadata.{field}", causes, old_meta.get(field, MISSING))
    return out, pruned, causes


def _without_meta(schema: Schema) -> Schema:
    s = dict(schema)
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k not in ("apiVersion", "kind", "metadata")}
    s["properties"] = props
    s["required"] = [r for r in schema.get("required") or [] if r not in ("apiVersion", "kind", "metadata")]
    return s
