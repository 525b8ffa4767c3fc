"""The runner index (pure, no I/O): each set's runners by bucket, kept from the informer's events,
so a cached decision costs the same at 3,000 runners as at 30 (README "runner-set worker", the
runner index; issue 10).

Without it every cached pass listed the set's runners from the informer, sorted and classified
them all (:func:`decide.bucket_runners`) and walked them for the expectations: O(N) per pass, and
a burst of N runners wakes the set O(N) times. The index does that work once per runner event
instead, and answers a pass with :class:`decide.Buckets` whose counts are ready and whose
(oldest-first) lists are sorted only when a plan reads them (a scale-down, finished runners to
reap, failed or outdated ones, a revision change), and then kept until that bucket changes.

It follows one informer's cache exactly, whatever its events say about the past:

- It is registered with ``replay=True`` (``ADDED`` for every object already cached), and the
  informer's initial list, a relist after a 410 (diffed against the cache: ``ADDED``/``MODIFIED``/
  ``DELETED`` for what changed) and resumed watches (stale events are dropped before any handler)
  all arrive as changes of the cache itself.
- Every change is applied by the informer's key: what the index held for that key (its own
  record, not the event's ``old``) is dropped, then the new object is filed, so a ``MODIFIED``
  that moves a runner to another set or takes its controller reference away, or a relist that
  replaced a namesake (another uid under the same key), leaves nothing behind. ``DELETED`` drops
  the key whatever the last state it carries.
- A runner belongs to the set its controller owner reference of kind EphemeralRunnerSet names
  (by uid), as :func:`decide.owned_by` decides; other runners are not indexed.
- The objects are the cache's own (shared, read-only): the index never changes them, and every
  list it hands out is a new one (a list handed out earlier is never changed afterwards).

Several informers (one per watched namespace): one index per informer, combined per pass over
the informers that may hold the set's namespace (:func:`buckets`), as the cached read did.
"""

from __future__ import annotations

from collections import ChainMap, Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.runner_set import decide
from services.runner_set.decide import Bucket, Buckets, Counts
from shared.api import EphemeralRunner
from shared.api.constants import KIND_EPHEMERAL_RUNNER_SET
from shared.kube import Change, ChangeType, ObjectKey


class StaleBuckets(RuntimeError):
    """A bucket list was read after the set's runners changed: a decision must read its lists in
    the synchronous step that took the buckets (after that, only their counts)."""


@dataclass(slots=True)
class _Filed:
    """What the index holds of one cached runner."""

    owner: str  # the controlling EphemeralRunnerSet's uid
    uid: str
    bucket: Bucket
    patch_id: int | None
    obj: EphemeralRunner


class SetRunners:
    """One set's runners in one informer: by bucket, counts, patch IDs, uid → deleting."""

    __slots__ = ("_latest", "_size", "_sorted", "by_bucket", "generation", "members", "patch_ids")

    def __init__(self) -> None:
        self.by_bucket: dict[Bucket, dict[ObjectKey, EphemeralRunner]] = {b: {} for b in Bucket}
        self.patch_ids: Counter[int] = Counter()  # a Counter: removing one runner keeps the others' IDs
        self.members: dict[str, bool] = {}  # uid → deleting (what expectations settle against)
        self.generation = 0  # bumped by every change: a Buckets taken before it is stale
        self._sorted: dict[Bucket, list[EphemeralRunner]] = {}
        self._latest: int | None = 0  # None: recompute (the newest patch ID's last runner went)
        self._size = 0  # runners filed (by key; ``members`` is by uid)

    def __len__(self) -> int:
        return self._size

    def add(self, key: ObjectKey, f: _Filed) -> None:
        self.by_bucket[f.bucket][key] = f.obj
        self._size += 1
        self.members[f.uid] = f.bucket is Bucket.DELETING
        if f.patch_id is not None:
            self.patch_ids[f.patch_id] += 1
            if self._latest is not None and f.patch_id > self._latest:
                self._latest = f.patch_id
        self._sorted.pop(f.bucket, None)
        self.generation += 1

    def drop(self, key: ObjectKey, f: _Filed) -> None:
        del self.by_bucket[f.bucket][key]
        self._size -= 1
        self.members.pop(f.uid, None)
        if f.patch_id is not None:
            self.patch_ids[f.patch_id] -= 1
            if not self.patch_ids[f.patch_id]:
                del self.patch_ids[f.patch_id]
                if f.patch_id == self._latest:
                    self._latest = None
        self._sorted.pop(f.bucket, None)
        self.generation += 1

    def counts(self) -> Counts:
        if self._latest is None:
            self._latest = max((p for p in self.patch_ids if p > 0), default=0)
        n = self.by_bucket
        return Counts(
            pending=len(n[Bucket.PENDING]),
            running=len(n[Bucket.RUNNING]),
            finished=len(n[Bucket.FINISHED]),
            failed=len(n[Bucket.FAILED]),
            outdated=len(n[Bucket.OUTDATED]),
            deleting=len(n[Bucket.DELETING]),
            latest_patch_id=self._latest,
        )

    def sorted(self, bucket: Bucket) -> list[EphemeralRunner]:
        """The bucket oldest first: sorted once per change of the bucket (a new list each time)."""
        found = self._sorted.get(bucket)
        if found is None:
            found = sorted(self.by_bucket[bucket].values(), key=decide.created_order)
            self._sorted[bucket] = found
        return found


def _owner(er: EphemeralRunner) -> str | None:
    ref = er.metadata.controller_reference()
    return ref.uid if ref is not None and ref.kind == KIND_EPHEMERAL_RUNNER_SET else None


class RunnerIndex:
    """The runners of one informer, by owning set; feed it every change (:meth:`apply`)."""

    def __init__(self, namespace: str | None = None) -> None:
        self.namespace = namespace  # the informer's (None: all namespaces)
        self._filed: dict[ObjectKey, _Filed] = {}
        self._sets: dict[str, SetRunners] = {}

    def __len__(self) -> int:
        return len(self._filed)

    def apply(self, change: Change[EphemeralRunner]) -> None:
        """Informer handler: make the index hold what the cache holds under ``change.key``."""
        old = self._filed.pop(change.key, None)
        if old is not None:
            runners = self._sets[old.owner]
            runners.drop(change.key, old)
            if not len(runners):
                del self._sets[old.owner]
        if change.type is ChangeType.DELETED:
            return
        er = change.obj
        owner = _owner(er)
        if owner is None:
            return
        f = _Filed(owner, er.metadata.uid, decide.bucket_of(er), decide.patch_id_of(er), er)
        self._filed[change.key] = f
        self._sets.setdefault(owner, SetRunners()).add(change.key, f)

    def of(self, owner_uid: str) -> SetRunners | None:
        return self._sets.get(owner_uid)


def _serves(index: RunnerIndex, namespace: str) -> bool:
    return index.namespace in (None, namespace)


def buckets(indexes: Sequence[RunnerIndex], owner_uid: str, namespace: str) -> Buckets:
    """The set's buckets from the indexes whose informer may hold ``namespace``: counts now, each
    list sorted when first read (:class:`StaleBuckets` if the set changed since)."""
    found = [r for i in indexes if _serves(i, namespace) and (r := i.of(owner_uid)) is not None]
    if not found:
        return Buckets(Counts(), lambda bucket: [])
    if len(found) == 1:
        one = found[0]
        counts, taken = one.counts(), one.generation

        def lists(bucket: Bucket) -> list[EphemeralRunner]:
            if one.generation != taken:
                raise StaleBuckets(f"{bucket} read after the set's runners changed")
            return one.sorted(bucket)

        return Buckets(counts, lists)
    parts = [r.counts() for r in found]
    counts = Counts(
        **{b.value: sum(c.of(b) for c in parts) for b in Bucket},
        latest_patch_id=max(c.latest_patch_id for c in parts),
    )
    taken_all = [r.generation for r in found]

    def merged(bucket: Bucket) -> list[EphemeralRunner]:
        if [r.generation for r in found] != taken_all:
            raise StaleBuckets(f"{bucket} read after the set's runners changed")
        return sorted((er for r in found for er in r.by_bucket[bucket].values()), key=decide.created_order)

    return Buckets(counts, merged)


def members(indexes: Sequence[RunnerIndex], owner_uid: str, namespace: str) -> Mapping[str, bool]:
    """The set's cached runners, uid → deleting (what expectations settle against), without
    walking them; with several informers the later one wins, as a dict built over their lists."""
    found = [r.members for i in indexes if _serves(i, namespace) and (r := i.of(owner_uid)) is not None]
    if len(found) == 1:
        return found[0]
    return ChainMap(*reversed(found))


__all__ = ["RunnerIndex", "SetRunners", "StaleBuckets", "buckets", "members"]
