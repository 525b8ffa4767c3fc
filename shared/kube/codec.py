"""Bytes ↔ typed objects for the access layer (errors become :class:`DecodeFailed`)."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from shared.api import ApiDecodeError, CustomObject, decode, to_dict
from shared.kube.errors import DecodeFailed
from shared.kube.resources import Resource

T = TypeVar("T")


def decode_object(resource: Resource[T], data: bytes | msgspec.Raw, what: str) -> T:
    """Decode one object of ``resource`` (raises DecodeFailed naming the bad field)."""
    raw = bytes(data) if isinstance(data, msgspec.Raw) else data
    try:
        return decode(resource.type, raw)
    except ApiDecodeError as exc:
        raise DecodeFailed(what, str(exc)) from None


def object_body(resource: Resource[Any], obj: Any) -> dict[str, Any]:
    """The JSON tree to send for ``obj`` (a struct or a JSON tree), with apiVersion and kind set.

    ``metadata.resourceVersion`` is dropped: a create that carries one is a 500 on a real server.
    """
    if isinstance(obj, dict):
        tree = dict(obj)
    elif isinstance(obj, (CustomObject, msgspec.Struct)):
        tree = to_dict(obj)
    else:
        raise TypeError(f"expected a struct or a JSON object for {resource.qualified}, got {type(obj).__name__}")
    tree["apiVersion"] = resource.api_version
    tree["kind"] = resource.kind
    meta = tree.get("metadata")
    if isinstance(meta, dict) and "resourceVersion" in meta:
        tree["metadata"] = {k: v for k, v in meta.items() if k != "resourceVersion"}
    return tree


class _ListHead(msgspec.Struct, kw_only=True):
    metadata: dict[str, Any] = {}
    items: list[msgspec.Raw] = []


def split_list(data: bytes, what: str) -> tuple[list[msgspec.Raw], str, str]:
    """A list body → (raw items, list resourceVersion, continue token)."""
    try:
        head = msgspec.json.decode(data, type=_ListHead)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeFailed(what, f"malformed list: {exc}") from None
    rv = head.metadata.get("resourceVersion", "")
    cont = head.metadata.get("continue", "")
    return head.items, str(rv or ""), str(cont or "")
