"""The emulator's per-request shortcuts (issue 10 item 5) answer as the full walks did: the
per-namespace key index, watchers offered only their resource's commits, and pruning of a
built-in update that skips the parts equal to the stored object."""

from __future__ import annotations

import copy
import random
from typing import Any

from services.embedded.apiserver.builtin_schema import prune_builtin
from services.embedded.apiserver.store import Store, Watcher, WatchFilter, storage_key


def obj(namespace: str, name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}}


def test_namespace_lists_match_a_filtered_walk_through_creates_and_deletes() -> None:
    store = Store()
    rng = random.Random(7)
    namespaces = ["t-x", "t-x-b", "a", "z"]
    live: set[tuple[str, str]] = set()
    for step in range(400):
        ns, name = rng.choice(namespaces), f"o{rng.randrange(40)}"
        if (ns, name) in live and step % 3:
            store.remove("things", ns, name)
            live.discard((ns, name))
        elif (ns, name) not in live:
            store.put_new("things", obj(ns, name))
            live.add((ns, name))
        else:
            store.replace("things", obj(ns, name))
        if step % 25 == 0:
            everything = store.items("things")
            assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in everything] == sorted(
                live, key=storage_key
            )
            for ns_name in [*namespaces, "none"]:
                walked = [o for o in everything if o["metadata"]["namespace"] == ns_name]
                got = store.items("things", ns_name)
                assert [id(o) for o in got] == [id(o) for o in walked]  # the stored versions, in order
    assert store.items("things", "none") == []


def test_commits_reach_only_the_watchers_of_their_resource() -> None:
    store = Store()
    pods, secrets = Watcher(WatchFilter("/pods", None), 100), Watcher(WatchFilter("/secrets", "ns"), 100)
    store.add_watcher(pods)
    store.add_watcher(secrets)
    store.put_new("/pods", obj("ns", "p"))
    store.put_new("/secrets", obj("ns", "s"))
    store.put_new("/secrets", obj("other", "s"))
    assert [(e.resource, e.name) for e in pods.pending] == [("/pods", "p")]
    assert [(e.resource, e.namespace) for e in secrets.pending] == [("/secrets", "ns")]
    store.remove_watcher(pods)
    store.put_new("/pods", obj("ns", "q"))
    assert len(pods.pending) == 1
    assert store.watchers == {secrets}


POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}},
    "spec": {
        "containers": [
            {"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}]},
            {"name": "d", "image": "j"},
        ],
        "nodeName": "n",
    },
    "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
}


def test_an_update_prunes_what_changed_and_keeps_what_equals_the_stored_object() -> None:
    stored, none_pruned = prune_builtin("", "Pod", copy.deepcopy(POD))
    assert none_pruned == []
    update = copy.deepcopy(stored)
    update["status"]["phase"] = "Running"
    update["status"]["unknownStatus"] = 1
    update["spec"]["containers"][1]["unknownField"] = 2
    update["spec"]["containers"][0]["env"][0]["junk"] = 3
    update["metadata"]["bogus"] = 4
    expected = prune_builtin("", "Pod", copy.deepcopy(update))  # without the stored object: a full walk
    assert prune_builtin("", "Pod", copy.deepcopy(update), stored) == expected
    assert expected[1] == [
        "metadata.bogus",
        "spec.containers[0].env[0].junk",
        "spec.containers[1].unknownField",
        "status.unknownStatus",
    ]
    # A part equal to the stored one is kept as sent; the stored object is never shared.
    unchanged = copy.deepcopy(stored)
    out, pruned = prune_builtin("", "Pod", unchanged, stored)
    assert (out, pruned) == (stored, [])
    assert out["spec"] is unchanged["spec"] and out["spec"] is not stored["spec"]
    same, _ = prune_builtin("", "Pod", stored, stored)  # the stored object itself: copied as before
    assert same == stored and same["spec"] is not stored["spec"]
