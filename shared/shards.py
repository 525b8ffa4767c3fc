"""Shard ownership, the part both lease backends share (README "Shard ownership leases").

Resource keys (``namespace/name``) hash to shards; each shard is leased by one replica of a
worker group. The protocol (:mod:`shared.membership`) is one core with two backends —
Kubernetes Leases (:mod:`shared.kube.leases`, the default) and NATS KV (:mod:`shared.bus.leases`)
— that differ only in where the membership records live; the hashing, the fair share, the split,
the claim plan, the change notification, the error a lost shard raises and the metrics are
defined here once, so neither backend depends on the other.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import Counter, Gauge

__all__ = [
    "LEASE_CHANGES",
    "SHARDS_OWNED",
    "ChangeCallback",
    "NotOwner",
    "ShardChange",
    "assign",
    "fair_share",
    "plan_membership",
    "resource_key",
    "shard_of",
]


class NotOwner(Exception):
    """This replica does not (or no longer) hold the lease for a key it was about to act on.

    Not a transport error of either backend: losing a lease is an ownership fact, whether the
    lease lived in Kubernetes or in NATS.
    """

    def __init__(self, key: str, shard: int | None = None) -> None:
        self.key = key
        self.shard = shard
        where = f" (shard {shard})" if shard is not None else ""
        super().__init__(f"not the owner of {key}{where}")


@dataclass(frozen=True)
class ShardChange:
    gained: frozenset[int]
    lost: frozenset[int]


ChangeCallback = Callable[[ShardChange], Awaitable[None] | None]


def resource_key(namespace: str, name: str) -> str:
    """The key a resource is sharded on."""
    return f"{namespace}/{name}"


def shard_of(key: str, shards: int) -> int:
    """Stable shard of a key: CRC-32 of its UTF-8 bytes (never Python's per-process ``hash()``)."""
    if shards < 1:
        raise ValueError("shards must be >= 1")
    return zlib.crc32(key.encode("utf-8")) % shards


def fair_share(shards: int, members: int) -> int:
    """How many shards one replica may hold: ceil(shards / live replicas)."""
    return math.ceil(shards / max(1, members))


# The names keep their historical ``bus`` prefix: dashboards and alerts already use them.
SHARDS_OWNED = Gauge("runnerscale_bus_shards_owned", "Shards this replica holds a lease on", ["group"])
LEASE_CHANGES = Counter(
    "runnerscale_bus_lease_changes_total",
    "Leases gained or lost",
    ["lease", "change"],  # change: gained | lost | released
)


def _score(member: str, shard: int) -> int:
    return zlib.crc32(f"{member}/{shard}".encode())


def assign(shards: int, members: list[str]) -> dict[int, str]:
    """Balanced rendezvous hashing: every shard to one member, at most ``fair_share`` per member.

    Pure and deterministic, so every replica that sees the same live members computes the same
    assignment. Pairs (member, shard) are taken by descending score; a member whose share is full
    is skipped. Most shards stay put when a member joins or leaves (README "Shard ownership leases").
    """
    if not members:
        return {}
    cap = fair_share(shards, len(members))
    pairs = sorted(((_score(m, s), m, s) for m in set(members) for s in range(shards)), reverse=True)
    out: dict[int, str] = {}
    load: dict[str, int] = {}
    for _, member, shard in pairs:
        if shard in out or load.get(member, 0) >= cap:
            continue
        out[shard] = member
        load[member] = load.get(member, 0) + 1
    return out


def plan_membership(
    me: str,
    shards: int,
    live: list[str],
    claimed: frozenset[int],
    acting: frozenset[int],
    others: dict[int, set[str]],
) -> frozenset[int]:
    """The shards this member should claim next (README "Shard ownership leases").

    ``live``: the live members (this one included); ``claimed``: what this member's record claims
    now; ``acting``: the claimed shards it acts on (confirmed); ``others``: shard -> other live
    members claiming it. A shard is claimed only if it is ours by :func:`assign` and no other
    live member claims it; an existing claim is kept while the shard is ours and either we act on
    it (nobody else can have confirmed it) or we win the tie-break against the other claimants.
    """
    mine = {s for s, m in assign(shards, live).items() if m == me}
    keep: set[int] = set()
    for s in mine:
        rivals = others.get(s, set())
        if not rivals or s in acting or (s in claimed and all(_score(me, s) > _score(r, s) for r in rivals)):
            keep.add(s)
    return frozenset(keep)
