"""Decoding of Kubernetes protobuf request bodies (``application/vnd.kubernetes.protobuf``).

client-go clientsets (since 0.35) and controller-runtime send built-in kinds, and the
DeleteOptions of a DELETE, as protobuf. A body is the ``k8s\\x00`` envelope (a ``runtime.Unknown``
naming apiVersion and kind) around the object's message. This module turns it into the JSON
shape the rest of the emulator works on; responses stay JSON (clients also accept it).

Why a small wire decoder driven by field tables instead of a protobuf library: no maintained
Python package carries the Kubernetes messages, and generating Python from k8s.io/api's .proto
files would put generated code for hundreds of messages in the tree. The wire format itself is
tiny (varints and length-delimited fields); what must be exact is each field's number, JSON name
and emptiness rule. ``protobuf_fields.json`` holds exactly that, written by reflection over the
Go types (``tests/goclient/prototables``), and the Go client test checks it is current. The few
types with a hand-written protobuf form (times, quantities, int-or-string, raw JSON, the CRD
schema unions) are decoded by the fixed rules below.
"""

from __future__ import annotations

import base64
import json
import struct
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

MAGIC = b"k8s\x00"
TABLES = Path(__file__).with_name("protobuf_fields.json")


class ProtobufError(ValueError):
    """The body is not a Kubernetes protobuf envelope, is malformed, or names a kind the
    emulator has no message table for."""


@cache
def _tables() -> dict[str, Any]:
    tables: dict[str, Any] = json.loads(TABLES.read_text())
    return tables


@cache
def _message(name: str) -> dict[int, dict[str, Any]]:
    return {f["n"]: f for f in _tables()["messages"][name]}


# --- wire format -------------------------------------------------------------------------------


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
        value: int | bytes
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
        if pos > len(buf):
            raise ProtobufError("truncated fixed-width field")
        out.append((number, wire, value))
    return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _packed_varints(raw: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(raw):
        v, pos = _varint(raw, pos)
        out.append(v)
    return out


# --- the types with a hand-written protobuf form --------------------------------------------


def _timestamp(raw: bytes) -> tuple[int, int] | None:
    """(seconds, nanos) of a metav1.Time/MicroTime message; None for the empty (zero) time."""
    if not raw:
        return None
    seconds = nanos = 0
    for number, _, v in _fields(raw):
        if number == 1:
            seconds = _signed(v)
        elif number == 2:
            nanos = _signed(v)
    if seconds == 0 and nanos == 0:
        return None
    return seconds, nanos


def _time(raw: bytes, micro: bool) -> str | None:
    ts = _timestamp(raw)
    if ts is None:
        return None  # the zero time: JSON null, i.e. unset
    at = datetime.fromtimestamp(ts[0], UTC)
    if micro:
        return at.strftime("%Y-%m-%dT%H:%M:%S") + f".{ts[1] // 1000:06d}Z"
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")  # metav1.Time keeps whole seconds only


def _go_duration(nanos: int) -> str:
    """Go's time.Duration.String() (``1h2m3.5s``, ``0s``, ``1.5ms``)."""
    if nanos == 0:
        return "0s"
    sign, n = ("-", -nanos) if nanos < 0 else ("", nanos)
    if n < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if n >= size:
                return sign + _trim(n / size) + unit
    hours, rest = divmod(n, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    seconds = _trim(rest / 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return sign + seconds


def _trim(x: float) -> str:
    return f"{x:.9f}".rstrip("0").rstrip(".")


def _sub(raw: bytes) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for number, _, v in _fields(raw):
        out.setdefault(number, []).append(v)
    return out


def _special(kind: str, raw: bytes) -> Any:
    if kind in ("time", "microtime"):
        return _time(raw, kind == "microtime")
    f = _sub(raw)
    if kind == "quantity":
        return f.get(1, [b""])[-1].decode()
    if kind == "duration":
        return _go_duration(_signed(f.get(1, [0])[-1]))
    if kind == "intorstr":
        if f.get(1, [0])[-1] == 1:
            return f.get(3, [b""])[-1].decode()
        return _signed(f.get(2, [0])[-1]) if f.get(2) else 0
    if kind == "rawjson":
        data = f.get(1, [b""])[-1]
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise ProtobufError(f"embedded JSON is malformed: {exc}") from None
    schema = "apiextensions/v1.JSONSchemaProps"
    if kind == "schema_or_array":  # {schema = 1, jSONSchemas = 2 (repeated)}
        if f.get(2):
            return [decode_message(v, schema) for v in f[2]]
        return decode_message(f[1][-1], schema) if f.get(1) else None
    if kind == "schema_or_bool":  # {allows = 1, schema = 2}
        if f.get(2):
            return decode_message(f[2][-1], schema)
        return bool(f.get(1, [0])[-1])
    if kind == "schema_or_strings":  # {schema = 1, property = 2 (repeated)}
        if f.get(2):
            return [v.decode() for v in f[2]]
        return decode_message(f[1][-1], schema) if f.get(1) else None
    raise ProtobufError(f"no decoding rule for {kind}")  # pragma: no cover - tables use the kinds above


# --- messages ---------------------------------------------------------------------------------

_ZERO = {"string": "", "int": 0, "uint": 0, "bool": False, "double": 0.0, "float": 0.0}


def _value(t: dict[str, Any], wire: int, raw: Any) -> Any:
    kind = t["k"]
    if kind == "string":
        return raw.decode()
    if kind == "bytes":
        return base64.b64encode(raw).decode()
    if kind == "bool":
        return bool(raw)
    if kind == "int":
        return _signed(raw)
    if kind == "uint":
        return raw
    if kind == "double":
        return struct.unpack("<d", raw)[0]
    if kind == "float":
        return struct.unpack("<f", raw)[0]
    if kind == "msg":
        return decode_message(raw, t["ref"])
    return _special(kind, raw)


def decode_message(buf: bytes, name: str) -> dict[str, Any]:
    """One message as the JSON the Go type marshals to."""
    table = _message(name)
    out: dict[str, Any] = {}
    inline: list[dict[str, Any]] = []
    for number, wire, raw in _fields(buf):
        f = table.get(number)
        if f is None:
            continue  # a field this version does not know: dropped, as the Go decoder does
        json_name, flags = f["name"], f.get("flags", "")
        if f["k"] == "map":
            key_raw = val_raw = None
            key_wire = val_wire = 2
            for n, w, v in _fields(raw):
                if n == 1:
                    key_raw, key_wire = v, w
                elif n == 2:
                    val_raw, val_wire = v, w
            key = _value(f["key"], key_wire, key_raw if key_raw is not None else _empty(f["key"]))
            value = _value(f["value"], val_wire, val_raw if val_raw is not None else _empty(f["value"]))
            out.setdefault(json_name, {})[str(key)] = value
        elif "r" in flags:
            items = out.setdefault(json_name, [])
            if wire == 2 and f["k"] in ("int", "uint", "bool"):
                items.extend(_value(f, 0, v) for v in _packed_varints(raw))
            else:
                items.append(_value(f, wire, raw))
        elif json_name == "":
            inline.append(_value(f, wire, raw))  # an embedded struct with `json:",inline"`
        else:
            value = _value(f, wire, raw)
            # Go writes non-pointer scalars even when zero; its JSON leaves them out under
            # omitempty (structs are never omitted by encoding/json, so messages stay).
            omitted = "o" in flags and "p" not in flags and f["k"] in _ZERO and value == _ZERO[f["k"]]
            if value is None and "p" not in flags:
                out[json_name] = None  # a zero metav1.Time (or raw JSON) struct marshals as null
            elif value is None or omitted:
                out.pop(json_name, None)
            else:
                out[json_name] = value
    for part in inline:
        out.update(part)
    for f in table.values():  # non-pointer scalars without omitempty are always in Go's JSON
        flags = f.get("flags", "")
        if f["name"] and f["k"] in _ZERO and not flags and f["name"] not in out:
            out[f["name"]] = _ZERO[f["k"]]
    return out


def _empty(t: dict[str, Any]) -> Any:
    return 0 if t["k"] in ("int", "uint", "bool") else b""


# --- envelopes --------------------------------------------------------------------------------


def _envelope(body: bytes) -> tuple[str, str, bytes]:
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
    return api_version, kind, raw


def decode_object(body: bytes) -> dict[str, Any]:
    """Decode a ``k8s\\x00`` envelope holding a built-in object into its JSON form."""
    api_version, kind, raw = _envelope(body)
    name = _tables()["kinds"].get(f"{api_version}/{kind}")
    if name is None:
        raise ProtobufError(f"protobuf bodies of {api_version}/{kind} are not supported by the emulator; send JSON")
    return {"apiVersion": api_version, "kind": kind, **decode_message(raw, name)}


def decode_options(body: bytes) -> dict[str, Any]:
    """Decode a ``k8s\\x00`` envelope holding DeleteOptions (or another options kind; they are
    registered in every group version, so any apiVersion is accepted)."""
    api_version, kind, raw = _envelope(body)
    name = _tables()["options"].get(kind)
    if name is None:
        raise ProtobufError(f"expected an options kind in the protobuf body, got {api_version}/{kind}")
    return {"apiVersion": api_version, "kind": kind, **decode_message(raw, name)}
