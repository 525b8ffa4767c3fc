"""The emulator's encoded-object cache (services/embedded/apiserver/store.py ``Store.encoded``):
a list or watch re-encodes an object only when it changed."""

from __future__ import annotations

from typing import Any

import msgspec

from services.embedded.apiserver.store import Store


def obj(name: str, value: int) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name}, "spec": {"v": value}}


def test_encoded_once_per_stored_version_and_dropped_with_the_object() -> None:
    store = Store()
    calls: list[str] = []

    def enc(o: dict[str, Any]) -> bytes:
        calls.append(o["metadata"]["name"])
        return msgspec.json.encode(o)

    store.put_new("things", obj("a", 1))
    first = store.get("things", "ns", "a")
    assert first is not None
    assert store.encoded("things", "f", first, enc) == store.encoded("things", "f", first, enc)
    assert calls == ["a"]  # the second call hit the cache

    store.replace("things", obj("a", 2))
    second = store.get("things", "ns", "a")
    assert second is not None
    assert b'"v":2' in store.encoded("things", "f", second, enc)
    assert b'"v":1' in store.encoded("things", "f", first, enc)  # an old version: encoded, not cached
    assert calls == ["a", "a", "a"]
    assert b'"v":2' in store.encoded("things", "f", second, enc)
    assert calls == ["a", "a", "a"]

    store.remove("things", "ns", "a")
    assert all(("ns", "a") not in cache for cache in store._encoded.values())
