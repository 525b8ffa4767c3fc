"""Decoding of Kubernetes protobuf request bodies for a few built-in kinds.

kubectl's typed generators (``kubectl create namespace|configmap|secret|serviceaccount|role|
rolebinding``) send ``application/vnd.kubernetes.protobuf`` bodies. This module decodes the
``k8s\\x00`` envelope (a ``runtime.Unknown``) and the messages of those kinds into the JSON shape,
using field numbers from k8s.io/api's generated.proto. Responses are always JSON (the clients
accept it). Other kinds answer 415 as before.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    """The body is not a Kubernetes protobuf envelope, or a kind the emulator cannot decode."""


# A schema maps field number -> (json name, type, sub-schema). Types: str, bytes (base64 in JSON),
# bool, int, msg, time, map_ss (map<string,string>), map_sb (map<string,bytes>); a "[]" suffix
# marks a repeated field.
Schema = dict[int, tuple[str, str, Any]]

OWNER_REF: Schema = {
    1: ("kind", "str", None),
    3: ("name", "str", None),
    4: ("uid", "str", None),
    5: ("apiVersion", "str", None),
    6: ("controller", "bool", None),
    7: ("blockOwnerDeletion", "bool", None),
}
OBJECT_META: Schema = {
    1: ("name", "str", None),
    2: ("generateName", "str", None),
    3: ("namespace", "str", None),
    5: ("uid", "str", None),
    6: ("resourceVersion", "str", None),
    7: ("generation", "int", None),
    8: ("creationTimestamp", "time", None),
    9: ("deletionTimestamp", "time", None),
    10: ("deletionGracePeriodSeconds", "int", None),
    11: ("labels", "map_ss", None),
    12: ("annotations", "map_ss", None),
    13: ("ownerReferences", "msg[]", OWNER_REF),
    14: ("finalizers", "str[]", None),
}
OBJECT_REF: Schema = {
    1: ("kind", "str", None),
    2: ("namespace", "str", None),
    3: ("name", "str", None),
    4: ("uid", "str", None),
    5: ("apiVersion", "str", None),
    6: ("resourceVersion", "str", None),
    7: ("fieldPath", "str", None),
}
POLICY_RULE: Schema = {
    1: ("verbs", "str[]", None),
    2: ("apiGroups", "str[]", None),
    3: ("resources", "str[]", None),
    4: ("resourceNames", "str[]", None),
    5: ("nonResourceURLs", "str[]", None),
}
SUBJECT: Schema = {
    1: ("kind", "str", None),
    2: ("apiGroup", "str", None),
    3: ("name", "str", None),
    4: ("namespace", "str", None),
}
ROLE_REF: Schema = {1: ("apiGroup", "str", None), 2: ("kind", "str", None), 3: ("name", "str", None)}

KINDS: dict[tuple[str, str], Schema] = {
    ("v1", "Namespace"): {1: ("metadata", "msg", OBJECT_META), 2: ("spec", "msg", {1: ("finalizers", "str[]", None)})},
    ("v1", "ConfigMap"): {
        1: ("metadata", "msg", OBJECT_META),
        2: ("data", "map_ss", None),
        3: ("binaryData", "map_sb", None),
        4: ("immutable", "bool", None),
    },
    ("v1", "Secret"): {
        1: ("metadata", "msg", OBJECT_META),
        2: ("data", "map_sb", None),
        3: ("type", "str", None),
        4: ("stringData", "map_ss", None),
        5: ("immutable", "bool", None),
    },
    ("v1", "ServiceAccount"): {
        1: ("metadata", "msg", OBJECT_META),
        2: ("secrets", "msg[]", OBJECT_REF),
        3: ("imagePullSecrets", "msg[]", {1: ("name", "str", None)}),
        4: ("automountServiceAccountToken", "bool", None),
    },
    ("rbac.authorization.k8s.io/v1", "Role"): {1: ("metadata", "msg", OBJECT_META), 2: ("rules", "msg[]", POLICY_RULE)},
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): {
        1: ("metadata", "msg", OBJECT_META),
        2: ("subjects", "msg[]", SUBJECT),
        3: ("roleRef", "msg", ROLE_REF),
    },
}


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtobufError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise ProtobufError("varint too long")


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """Split a message into (field number, wire type, value) triples."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise ProtobufError("truncated length-delimited field")
            value, pos = buf[pos : pos + length], pos + length
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
        out.append((number, wire, value))
    return out


def _map_entry(raw: bytes) -> tuple[str, bytes]:
    key, value = "", b""
    for number, _, v in _fields(raw):
        if number == 1:
            key = v.decode()
        elif number == 2:
            value = v
    return key, value


def _time(raw: bytes) -> str:
    seconds = 0
    for number, _, v in _fields(raw):
        if number == 1:
            seconds = v
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def decode_message(buf: bytes, schema: Schema) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for number, _, value in _fields(buf):
        if number not in schema:
            continue  # a field the emulator does not model: dropped, as pruning would
        name, typ, sub = schema[number]
        repeated = typ.endswith("[]")
        base = typ.removesuffix("[]")
        if base == "str":
            v: Any = value.decode()
            if v == "" and not repeated:
                continue  # Go's omitempty: an empty string is not serialised
        elif base == "bytes":
            v = base64.b64encode(value).decode()
        elif base == "bool":
            v = bool(value)
        elif base == "int":
            v = value - (1 << 64) if value >= 1 << 63 else value
        elif base == "msg":
            v = decode_message(value, sub)
        elif base == "time":
            v = _time(value)
        elif base in ("map_ss", "map_sb"):
            k, raw = _map_entry(value)
            out.setdefault(name, {})[k] = raw.decode() if base == "map_ss" else base64.b64encode(raw).decode()
            continue
        else:  # pragma: no cover - schema tables only use the types above
            raise ProtobufError(f"unknown schema type {typ}")
        if repeated:
            out.setdefault(name, []).append(v)
        else:
            out[name] = v
    return out


def decode_object(body: bytes) -> dict[str, Any]:
    """Decode a ``k8s\\x00`` protobuf envelope into a JSON object, for the supported kinds."""
    if not body.startswith(MAGIC):
        raise ProtobufError("missing the k8s protobuf envelope prefix")
    api_version = kind = ""
    raw = b""
    for number, _, value in _fields(body[len(MAGIC) :]):
        if number == 1:
            for n, _, v in _fields(value):
                if n == 1:
                    api_version = v.decode()
                elif n == 2:
                    kind = v.decode()
        elif number == 2:
            raw = value
    schema = KINDS.get((api_version, kind))
    if schema is None:
        raise ProtobufError(f"protobuf bodies of {api_version}/{kind} are not supported by the emulator; send JSON")
    obj = decode_message(raw, schema)
    return {"apiVersion": api_version, "kind": kind, **obj}
