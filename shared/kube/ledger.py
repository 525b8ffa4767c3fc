"""The patches one reconcile sends, and the rule they keep (README "Worker runtime").

Rule: one reconcile writes at most one metadata/spec patch and one status patch per object. Two
patches of the same part of one object in one pass mean the pass decided twice on what it had just
written (each write a round trip, a new resourceVersion, and a watch event every informer decodes);
the second belongs in the first, or in the next reconcile, which the first write's watch event
triggers anyway (kopf's "one patch per cycle").

:class:`ApiWriter` records every PATCH/PUT it sends into the ledger of the running reconcile (a
context variable set by the controller around each attempt); :func:`repeated_patches` is the pure
check the controller applies afterwards (metric ``runnerscale_reconcile_repeated_patches_total``
and a warning naming the object).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import msgspec

from shared.kube.resources import ObjectKey

_LEDGER: ContextVar[list[PatchRecord] | None] = ContextVar("runnerscale_kube_patch_ledger", default=None)


class PatchRecord(msgspec.Struct, frozen=True):
    """One PATCH or PUT: which object (``resource`` qualified plural, key) and which part
    (``status`` for the status subresource, ``""`` for metadata and spec)."""

    resource: str
    key: ObjectKey
    part: str = ""


class RepeatedPatch(msgspec.Struct, frozen=True):
    resource: str
    key: ObjectKey
    part: str
    count: int

    def describe(self) -> str:
        target = f"{self.key.namespace}/{self.key.name}" if self.key.namespace else self.key.name
        return f"{self.count} {self.part or 'metadata/spec'} patches of {self.resource} {target}"


def note_patch(resource: str, key: ObjectKey, part: str) -> None:
    """Called by the writer for every PATCH/PUT; a no-op outside a recorded reconcile."""
    ledger = _LEDGER.get()
    if ledger is not None:
        ledger.append(PatchRecord(resource, key, part))


@contextmanager
def recording() -> Iterator[list[PatchRecord]]:
    """Collect the patches sent inside this block (and the tasks it starts) into a fresh list."""
    ledger: list[PatchRecord] = []
    token = _LEDGER.set(ledger)
    try:
        yield ledger
    finally:
        _LEDGER.reset(token)


def repeated_patches(records: Sequence[PatchRecord]) -> list[RepeatedPatch]:
    """Objects patched more than once in the same part (pure; sorted for stable messages)."""
    counts = Counter(records)
    return sorted(
        (RepeatedPatch(r.resource, r.key, r.part, n) for r, n in counts.items() if n > 1),
        key=lambda r: (r.resource, r.key.namespace, r.key.name, r.part),
    )
