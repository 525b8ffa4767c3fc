"""The informer cache against the API under test: sync, scoping, handlers, and convergence
under dropped watch streams, forced compaction (410 → relist), watch lag and bookmarks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, TypeVar

import anyio
import msgspec
import pytest

from services.embedded.apiserver import EmulatorControl
from shared.api import presence
from shared.kube import EPHEMERAL_RUNNER_SETS, ApiReader, ApiWriter, Change, ChangeType, Informer, KubeClient, ObjectKey
from shared.kube.informer import is_stale

from .conftest import ers, eventually

pytestmark = pytest.mark.anyio

T = TypeVar("T")


class StartInformer(Protocol):
    """The ``running`` fixture: runs an informer until the test ends, returns it once synced."""

    async def __call__(self, informer: Informer[T], /) -> Informer[T]: ...


@pytest.fixture
async def running() -> AsyncIterator[StartInformer]:
    """Start informers in a task group that is cancelled at the end of the test."""
    async with anyio.create_task_group() as tg:

        async def start(informer: Informer[T], /) -> Informer[T]:
            tg.start_soon(informer.run)
            await informer.wait_synced(15)
            return informer

        yield start
        tg.cancel_scope.cancel()


async def converged(informer: Informer[Any], reader: ApiReader, namespace: str) -> bool:
    """Cache == server: same keys with the same resourceVersions."""
    live = await reader.list(EPHEMERAL_RUNNER_SETS, namespace=namespace)
    server = {(e.metadata.name, e.metadata.resource_version) for e in live.items}
    cached = {(e.metadata.name, e.metadata.resource_version) for e in informer.list_cached(namespace=namespace)}
    return server == cached


async def wait_converged(informer: Informer[Any], reader: ApiReader, namespace: str, timeout: float = 15.0) -> None:
    await eventually(lambda: converged(informer, reader, namespace), timeout=timeout, what="the informer converged")


def test_stale_event_detection_is_numeric() -> None:
    assert is_stale("10", "9") and is_stale("10", "10") and not is_stale("9", "10")
    assert not is_stale("", "5") and not is_stale("abc", "5")  # opaque versions are never judged


async def test_sync_scopes_and_cached_reads(
    kube: KubeClient, writer: ApiWriter, namespace: str, running: StartInformer
) -> None:
    other = f"{namespace}-o"
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "a", labels={"team": "x"}))
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "b", labels={"team": "y"}))
    everything = await running(Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace))
    team_x = await running(Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace, label_selector="team=x"))
    assert everything.has_synced.is_set() and len(everything) == 2
    assert [e.metadata.name for e in team_x.list_cached()] == ["a"]
    assert [e.metadata.name for e in everything.list_cached("team in (y,z)")] == ["b"]
    assert everything.list_cached(namespace=other) == []

    cached = everything.get_cached(f"{namespace}/a")
    assert cached is not None and cached.spec.replicas == 1
    cached.spec.replicas = 99  # callers get copies: the cache is not mutated
    again = everything.get_cached(ObjectKey(namespace, "a"))
    assert again is not None and again.spec.replicas == 1

    # Namespace scope is applied by the server; an all-namespaces informer sees both namespaces.
    cluster_wide = await running(Informer(kube, EPHEMERAL_RUNNER_SETS))
    elsewhere = await writer.create(EPHEMERAL_RUNNER_SETS, ers("default", f"elsewhere-{namespace}"))
    try:
        await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "c"))
        await eventually(lambda: everything.get_cached(f"{namespace}/c") and cluster_wide.get_cached(f"{namespace}/c"))
        await eventually(lambda: cluster_wide.get_cached(f"default/elsewhere-{namespace}") is not None)
        assert everything.get_cached(f"default/elsewhere-{namespace}") is None
        assert {e.metadata.namespace for e in everything.list_cached()} == {namespace}
    finally:
        await writer.delete(EPHEMERAL_RUNNER_SETS, f"default/{elsewhere.metadata.name}")

    # Relabelling moves an object out of / into the selector-scoped cache.
    await writer.patch_merge(EPHEMERAL_RUNNER_SETS, f"{namespace}/a", {"metadata": {"labels": {"team": "y"}}})
    await writer.patch_merge(EPHEMERAL_RUNNER_SETS, f"{namespace}/b", {"metadata": {"labels": {"team": "x"}}})
    await eventually(
        lambda: [e.metadata.name for e in team_x.list_cached()] == ["b"], what="selector cache follows relabel"
    )


async def test_cache_holds_one_lean_copy_and_hands_out_equal_copies(
    kube: KubeClient, writer: ApiWriter, reader: ApiReader, namespace: str, running: StartInformer
) -> None:
    """Issue 10 (memory and decode cost): the cache keeps one decoded object per key, without the
    JSON it came from, without the presence record (8x the decode time) and without
    ``managedFields`` (a real API server sends them, the emulator does not); a copy it hands out
    equals the server's object less those and is the caller's own."""
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "a", labels={"team": "x"}))
    informer = await running(Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace))
    entry = informer._items[ObjectKey(namespace, "a")]
    assert not hasattr(entry, "raw")
    assert presence.given(entry.obj) is None and presence.given(entry.obj.spec) is None
    server = await reader.get(EPHEMERAL_RUNNER_SETS, f"{namespace}/a")
    copied = informer.get_cached(f"{namespace}/a")
    assert entry.obj.metadata.managed_fields == []
    without = msgspec.structs.replace(server, metadata=msgspec.structs.replace(server.metadata, managed_fields=[]))
    assert copied == without and copied is not entry.obj
    assert informer.list_owned_by("no-such-owner") == []


async def test_handlers_see_added_modified_deleted_in_order(
    kube: KubeClient, writer: ApiWriter, namespace: str, running: StartInformer
) -> None:
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "pre"))
    informer = await running(Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace))
    seen: list[tuple[str, str]] = []

    def record(change: Change[Any]) -> None:
        seen.append((str(change.type), change.key.name))

    def broken(change: Change[Any]) -> None:
        raise RuntimeError("a failing handler must not stop the informer")

    informer.add_handler(broken)
    remove = informer.add_handler(record, replay=True)
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "n"))
    await writer.patch_merge(EPHEMERAL_RUNNER_SETS, f"{namespace}/n", {"spec": {"replicas": 2}})
    await writer.delete(EPHEMERAL_RUNNER_SETS, f"{namespace}/n")
    expected = [("ADDED", "pre"), ("ADDED", "n"), ("MODIFIED", "n"), ("DELETED", "n")]
    await eventually(lambda: seen == expected, what="ordered changes")
    remove()
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "later"))
    await eventually(lambda: informer.get_cached(f"{namespace}/later") is not None)
    assert seen == expected  # unregistered


async def test_converges_after_dropped_streams_without_relisting(
    kube: KubeClient,
    reader: ApiReader,
    writer: ApiWriter,
    namespace: str,
    running: StartInformer,
    control: EmulatorControl,
) -> None:
    informer = await running(Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace))
    for i in range(20):
        await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, f"r{i}"))
        if i % 5 == 0:
            control.cut_watches(abrupt=bool(i % 10))  # alternate clean EOF and a broken connection
    async with anyio.create_task_group() as tg:

        async def churn(i: int) -> None:
            for n in range(3):
                await writer.patch_merge(EPHEMERAL_RUNNER_SETS, f"{namespace}/r{i}", {"spec": {"replicas": n + 2}})

        for i in range(20):
            tg.start_soon(churn, i)
        for _ in range(3):
            control.cut_watches(abrupt=True)
            await anyio.sleep(0.02)  # spread the cuts over the churn (pacing, not synchronisation)
    await writer.delete(EPHEMERAL_RUNNER_SETS, f"{namespace}/r0")
    control.add_fault(action="drop_watch", resource="ephemeralrunnersets", namespace=namespace, after_events=1, times=2)
    await writer.delete(EPHEMERAL_RUNNER_SETS, f"{namespace}/r1")
    await writer.patch_merge(EPHEMERAL_RUNNER_SETS, f"{namespace}/r2", {"spec": {"replicas": 9}})
    await wait_converged(informer, reader, namespace)
    r2 = informer.get_cached(f"{namespace}/r2")
    assert informer.get_cached(f"{namespace}/r0") is None and r2 is not None and r2.spec.replicas == 9
    assert informer.relists == 1  # every break resumed from the last resourceVersion
    assert informer.watches > 1


async def test_relists_after_compaction_and_converges(
    kube: KubeClient,
    reader: ApiReader,
    writer: ApiWriter,
    namespace: str,
    running: StartInformer,
    control: EmulatorControl,
) -> None:
    for i in range(3):
        await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, f"c{i}"))
    informer = await running(Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace))
    deleted: list[str] = []
    informer.add_handler(
        lambda ch: deleted.append(ch.key.name) if ch.type == ChangeType.DELETED else None, replay=False
    )
    # Hold events back, change things, compact the history and break the stream: the informer's
    # resume point is now older than the server remembers, so it gets 410 and must relist.
    control.settings(watch_lag_seconds=5)
    await writer.delete(EPHEMERAL_RUNNER_SETS, f"{namespace}/c0")
    await writer.patch_merge(EPHEMERAL_RUNNER_SETS, f"{namespace}/c1", {"spec": {"replicas": 4}})
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "c3"))
    control.compact()
    control.cut_watches(abrupt=True)
    control.settings(watch_lag_seconds=0)
    await wait_converged(informer, reader, namespace)
    assert informer.relists >= 2
    assert deleted == ["c0"]  # the relist diff reported the deletion it missed
    c1 = informer.get_cached(f"{namespace}/c1")
    assert c1 is not None and c1.spec.replicas == 4


async def test_converges_under_watch_lag(
    kube: KubeClient,
    reader: ApiReader,
    writer: ApiWriter,
    namespace: str,
    running: StartInformer,
    control: EmulatorControl,
) -> None:
    informer = await running(Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace))
    control.settings(watch_lag_seconds=1.5)
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "lag"))
    # The cache lags the server: that is why decisions re-read through ApiReader.
    assert informer.get_cached(f"{namespace}/lag") is None
    assert (await reader.get(EPHEMERAL_RUNNER_SETS, f"{namespace}/lag")).metadata.name == "lag"
    await wait_converged(informer, reader, namespace)


async def test_bookmarks_advance_the_resume_point(
    kube: KubeClient, writer: ApiWriter, namespace: str, running: StartInformer, control: EmulatorControl
) -> None:
    previous = control.settings()["bookmark_interval_seconds"]
    control.settings(bookmark_interval_seconds=0.2)
    try:
        informer = await running(Informer(kube, EPHEMERAL_RUNNER_SETS, namespace=namespace))
        start = int(informer.resource_version)
        # A write elsewhere moves the global resourceVersion; only a bookmark can tell this informer.
        created = await writer.create(EPHEMERAL_RUNNER_SETS, ers("default", f"bm-{namespace}"))
        try:
            await eventually(
                lambda: int(informer.resource_version) >= int(created.metadata.resource_version),
                what="bookmark advances the RV",
            )
            assert int(informer.resource_version) > start and len(informer) == 0
        finally:
            await writer.delete(EPHEMERAL_RUNNER_SETS, f"default/bm-{namespace}")
    finally:
        control.settings(bookmark_interval_seconds=previous)
