"""The runner index (services/runner_set/index.py) against what it replaces: for random sequences of
runner events, fed through real informers (watch lines, relists, stale replays; no server), each
set's buckets, counts, latest patch ID and uid → deleting from the index equal
``decide.bucket_runners`` over the informers' owned runners, and ``decide.plan`` gives the same
Plan from both."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import msgspec
import pytest

from services.runner_set import decide, index
from services.runner_set.failures import FailurePolicy
from shared.api import EphemeralRunner, EphemeralRunnerSet, decode
from shared.api.constants import ANNOTATION_ACTIONABLE_REVISION, ANNOTATION_FAILED_AT, ANNOTATION_PATCH_ID
from shared.kube import EPHEMERAL_RUNNERS, Informer
from tests.unit.services.runner_set import test_decide as decide_tests
from tests.unit.services.runner_set.test_decide import T0

SETS = {"A": "uid-A", "B": "uid-B"}  # set name → uid; both in namespace "ns"
PHASES = ["", "Pending", "Running", "Succeeded", "Failed", "Outdated"]


class _NoClient:
    """The informers below are fed watch lines and relists directly; nothing reaches a client."""


def _informer(namespace: str | None) -> Informer[EphemeralRunner]:
    return Informer(_NoClient(), EPHEMERAL_RUNNERS, namespace=namespace)  # type: ignore[arg-type]


def _ers(rng: random.Random, name: str) -> EphemeralRunnerSet:
    revision = rng.randint(0, 3)
    s = decide_tests.ers(
        replicas=rng.randint(0, 12),
        patch_id=rng.choice([0, 0, 1, 2, 3, 4, 5]),
        revision=revision,
        applied=rng.choice([revision, revision, max(0, revision - 1)]),
        marker=rng.choice([None, 0, 2, 4]),
    )
    assert s.status is not None
    return msgspec.structs.replace(
        s,
        metadata=msgspec.structs.replace(s.metadata, name=name, uid=SETS[name]),
        status=msgspec.structs.replace(s.status, pending_ephemeral_runners=rng.randint(0, 3)),
    )


class World:
    """The server's runners (JSON) and the informers that watch them; events are delivered,
    missed (healed by a relist), or replayed stale."""

    def __init__(self, rng: random.Random, namespaces: list[str | None]) -> None:
        self.rng = rng
        self.objects: dict[str, dict[str, Any]] = {}  # "ns/name" → object
        self.rv = 10
        self.serial = 0
        self.informers = [_informer(ns) for ns in namespaces]
        self.indexes: list[index.RunnerIndex] = []
        self.history: list[dict[str, Any]] = []  # every version sent (for stale replays)

    def attach(self) -> None:
        """Register the indexes now (replay: what the informers already hold)."""
        self.indexes = [index.RunnerIndex(i.namespace) for i in self.informers]
        for informer, idx in zip(self.informers, self.indexes, strict=True):
            informer.add_handler(idx.apply)

    def _owner_refs(self) -> list[dict[str, Any]]:
        roll = self.rng.random()
        if roll < 0.08:
            return []
        name = self.rng.choice(["A", "A", "B"])
        ref: dict[str, Any] = {"apiVersion": "actions.github.com/v1alpha1", "kind": "EphemeralRunnerSet"}
        ref |= {"name": name, "uid": SETS[name], "controller": roll >= 0.14}  # some refs are not the controller
        if roll > 0.96:
            ref["kind"] = "AutoscalingRunnerSet"  # a controller that is no runner set
        return [ref]

    def _randomize(self, obj: dict[str, Any]) -> None:
        rng, meta = self.rng, obj["metadata"]
        ann: dict[str, str] = {}
        patch = rng.choice([None, None, 0, 1, 2, 3, 4, 5, 9, -1, "x"])
        if patch is not None:
            ann[ANNOTATION_PATCH_ID] = str(patch)
        if rng.random() < 0.7:
            ann[ANNOTATION_ACTIONABLE_REVISION] = str(rng.randint(0, 3))
        phase = rng.choice(PHASES)
        if phase == "Failed" and rng.random() < 0.7:
            ann[ANNOTATION_FAILED_AT] = (T0 - dt.timedelta(seconds=rng.randint(0, 900))).isoformat()
        meta["annotations"] = ann
        if rng.random() < 0.15:
            meta["deletionTimestamp"] = "2026-11-29T12:00:00Z"
        job = rng.random() < 0.4
        obj["status"] = {
            "phase": phase,
            "runnerId": rng.choice([0, 7, 8]),
            "jobId": "j" if job else "",
            "jobRequestId": 1 if job else 0,
        }

    def _bump(self, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def new_object(self, name: str | None = None) -> dict[str, Any]:
        self.serial += 1
        ns = self.rng.choice(["ns", "ns", "ns", "other"])
        obj: dict[str, Any] = {
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunner",
            "metadata": {
                "name": name or f"set-runner-{self.serial}",
                "namespace": ns,
                "uid": f"u{self.serial}",
                # Few distinct times: ties are broken by name, as in bucket_runners.
                "creationTimestamp": (T0 + dt.timedelta(seconds=self.rng.randint(0, 5))).isoformat(),
                "ownerReferences": self._owner_refs(),
            },
            "spec": {"githubConfigUrl": "https://github.com/org", "githubConfigSecret": "s", "runnerScaleSetId": 1},
        }
        self._randomize(obj)
        self._bump(obj)
        return obj

    def _send(self, kind: str, obj: dict[str, Any]) -> None:
        self.history.append(obj)
        line = msgspec.json.encode({"type": kind, "object": obj})
        for informer in self.informers:
            if informer.namespace in (None, obj["metadata"]["namespace"]):
                informer._handle_line(line)

    def step(self) -> None:
        rng = self.rng
        op = rng.random()
        names = sorted(self.objects)
        deliver = rng.random() > 0.1  # some changes are missed by the watch (healed by the next relist)
        if op < 0.35 or not names:
            obj = self.new_object()
            self.objects[_key(obj)] = obj
            if deliver:
                self._send("ADDED", obj)
        elif op < 0.7:
            obj = msgspec.json.decode(msgspec.json.encode(self.objects[rng.choice(names)]))
            if rng.random() < 0.2:
                obj["metadata"]["ownerReferences"] = self._owner_refs()  # moved, or lost its controller
            else:
                self._randomize(obj)
            self._bump(obj)
            self.objects[_key(obj)] = obj
            if deliver:
                self._send("MODIFIED", obj)
        elif op < 0.85:
            obj = self.objects.pop(rng.choice(names))
            last = msgspec.json.decode(msgspec.json.encode(obj))
            if rng.random() < 0.3:
                last["metadata"]["ownerReferences"] = self._owner_refs()  # a last state the cache never saw
            self._bump(last)
            if deliver:
                self._send("DELETED", last)
        elif op < 0.9:
            # A namesake: deleted and created again under the same name (another uid), unseen
            # by the watch; the relist reports it as a MODIFIED of the key.
            old = self.objects[rng.choice(names)]
            obj = self.new_object(old["metadata"]["name"])
            obj["metadata"]["namespace"] = old["metadata"]["namespace"]
            self.objects[_key(obj)] = obj
            self.relist()
        elif op < 0.95:
            self.relist()
        elif self.history:
            self._send("MODIFIED", rng.choice(self.history))  # a stale replay: the informer drops it

    def relist(self) -> None:
        for informer in self.informers:
            raws = [
                msgspec.json.encode(o)
                for o in self.objects.values()
                if informer.namespace in (None, o["metadata"]["namespace"])
            ]
            informer._replace_all([e for e in (informer._decode_entry(r) for r in raws) if e is not None])


def _key(obj: dict[str, Any]) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def _reference(world: World, ers: EphemeralRunnerSet) -> tuple[decide.Buckets, dict[str, bool]]:
    """What the cached pass read before the index: the informers' owned runners, bucketed."""
    found: list[EphemeralRunner] = []
    for informer in world.informers:
        if informer.namespace in (None, ers.metadata.namespace):
            found += informer.list_owned_by(ers.metadata.uid, copy=False)
    owned = decide.owned_by(found, ers)
    return decide.bucket_runners(owned), {er.metadata.uid: er.metadata.is_deleting for er in owned}


def _lists(b: decide.Buckets) -> list[list[EphemeralRunner]]:
    return [b.pending, b.running, b.finished, b.failed, b.outdated, b.deleting]


def _check(world: World, rng: random.Random) -> None:
    for name in SETS:
        ers = _ers(rng, name)
        want, want_members = _reference(world, ers)
        got = index.buckets(world.indexes, ers.metadata.uid, "ns")
        assert got.counts == want.counts
        assert dict(index.members(world.indexes, ers.metadata.uid, "ns")) == want_members
        now = T0 + dt.timedelta(seconds=rng.choice([0, 30, 61, 400, 1000]))
        policy = rng.choice([None, FailurePolicy(), FailurePolicy(budget_failures=1)])
        fresh = index.buckets(world.indexes, ers.metadata.uid, "ns")  # lists not read yet: plan reads them
        assert decide.plan(ers, fresh, now, policy) == decide.plan(ers, want, now, policy)
        assert _lists(got) == _lists(want)
        for mine, theirs in zip(_lists(got), _lists(want), strict=True):
            assert [id(er) for er in mine] == [id(er) for er in theirs]  # the cache's own objects, same order


@pytest.mark.parametrize(
    "namespaces",
    [[None], ["ns", "other"], [None, "ns"]],
    # overlapping: two informers hold the set's runners; the indexes combine them as the
    # concatenated cached lists did (each runner counted once per informer)
    ids=["cluster-wide", "per-namespace", "overlapping"],
)
@pytest.mark.parametrize("seed", range(25))
def test_index_equals_bucket_runners_over_the_cache(seed: int, namespaces: list[str | None]) -> None:
    rng = random.Random(seed)
    world = World(rng, namespaces)
    attach_at = rng.randint(0, 20)  # the indexes join informers that may already hold runners
    for step in range(120):
        if step == attach_at:
            world.attach()
        world.step()
        if world.indexes:
            _check(world, rng)
    world.relist()
    _check(world, rng)


def test_a_scale_up_pass_reads_counts_only() -> None:
    """A steady or scale-up plan never asks the index for a list (none is sorted), a scale-down does."""
    rng = random.Random(1)
    world = World(rng, [None])
    world.attach()
    for _ in range(50):
        obj = world.new_object()
        obj["metadata"]["namespace"] = "ns"
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "actions.github.com/v1alpha1", "kind": "EphemeralRunnerSet", "name": "A"}
            | {"uid": SETS["A"], "controller": True}
        ]
        obj["metadata"].pop("deletionTimestamp", None)
        obj["metadata"]["annotations"] = {ANNOTATION_PATCH_ID: "3"}
        obj["status"] = {"phase": rng.choice(["", "Running"]), "runnerId": 7}
        world.objects[_key(obj)] = obj
        world._send("ADDED", obj)
    read: list[decide.Bucket] = []
    counts = index.buckets(world.indexes, SETS["A"], "ns").counts

    def spy(replicas: int, patch_id: int) -> decide.Plan:
        real = index.buckets(world.indexes, SETS["A"], "ns")

        def listed(bucket: decide.Bucket) -> list[EphemeralRunner]:
            read.append(bucket)
            return real._source(bucket)

        b = decide.Buckets(real.counts, listed)
        ers = msgspec.structs.replace(
            _ers(rng, "A"),
            spec=msgspec.structs.replace(
                _ers(rng, "A").spec, replicas=replicas, patch_id=patch_id, actionable_revision=0
            ),
            status=None,
        )
        return decide.plan(ers, b, T0, FailurePolicy())

    assert spy(80, 4).reason == "scale-up" and read == []
    assert spy(50, 4).reason == "steady" and read == []
    assert spy(50, 3).reason == "patch-already-applied" and read == []
    assert counts.pending + counts.running == 50
    assert spy(10, 0).reason == "scale-down" and set(read) == {decide.Bucket.PENDING, decide.Bucket.RUNNING}


def test_buckets_taken_before_a_change_refuse_to_list_it() -> None:
    rng = random.Random(2)
    world = World(rng, [None])
    world.attach()
    obj = world.new_object()
    obj["metadata"]["namespace"] = "ns"
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "actions.github.com/v1alpha1", "kind": "EphemeralRunnerSet", "name": "A"}
        | {"uid": SETS["A"], "controller": True}
    ]
    world._send("ADDED", obj)
    before = index.buckets(world.indexes, SETS["A"], "ns")
    world._send("ADDED", world.new_object())  # maybe another set's: any change of A's makes it stale
    obj2 = msgspec.json.decode(msgspec.json.encode(obj))
    world._bump(obj2)
    world._send("MODIFIED", obj2)
    with pytest.raises(index.StaleBuckets):
        _ = before.all
    assert before.counts.of(decide.bucket_of(decode(EphemeralRunner, obj))) == 1  # counts stay what they were
