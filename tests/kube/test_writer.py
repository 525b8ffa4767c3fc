"""Reader and writer against the API under test: typed reads, the merge-patch content type on the
wire, optimistic locking, retry_on_conflict, the status subresource, deletes and finalizers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from shared.api import EphemeralRunnerSet
from shared.kube import (
    EPHEMERAL_RUNNER_SETS,
    PODS,
    AlreadyExists,
    ApiReader,
    ApiWriter,
    BadRequest,
    Conflict,
    Invalid,
    KubeClient,
    LocklessWrite,
    NotFound,
    ObjectKey,
    retry_on_conflict,
)
from tests.fixtures.apiserver import KubeApi
from tests.support.eventually import eventually

from .conftest import ers, pod

pytestmark = pytest.mark.anyio


async def test_create_get_list_are_typed_and_carry_resource_versions(
    reader: ApiReader, writer: ApiWriter, namespace: str
) -> None:
    created = await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "a", labels={"team": "x"}))
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "b"))
    assert isinstance(created, EphemeralRunnerSet) and created.metadata.resource_version and created.metadata.uid

    got = await reader.get(EPHEMERAL_RUNNER_SETS, f"{namespace}/a")
    assert got.spec.replicas == 1 and got.metadata.resource_version == created.metadata.resource_version

    listed = await reader.list(EPHEMERAL_RUNNER_SETS, namespace=namespace, page_size=1)  # forces paging
    assert [e.metadata.name for e in listed.items] == ["a", "b"]
    assert int(listed.resource_version) >= int(created.metadata.resource_version)
    selected = await reader.list(EPHEMERAL_RUNNER_SETS, namespace=namespace, label_selector="team=x")
    assert [e.metadata.name for e in selected.items] == ["a"]
    assert await reader.get_or_none(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "zzz")) is None


async def test_create_conflicts_and_missing_objects_are_typed_errors(
    reader: ApiReader, writer: ApiWriter, namespace: str
) -> None:
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "dup"))
    with pytest.raises(AlreadyExists) as exists:
        await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "dup"))
    assert f"{namespace}/dup" in str(exists.value) and exists.value.status == 409
    with pytest.raises(NotFound) as missing:
        await reader.get(EPHEMERAL_RUNNER_SETS, f"{namespace}/nope")
    assert missing.value.request == f"GET ephemeralrunnersets.actions.github.com {namespace}/nope"
    with pytest.raises(Invalid) as invalid:
        await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "Not_A_Valid_Name"))
    assert any(c.field == "metadata.name" for c in invalid.value.causes)


# --- the content type on the wire ---------------------------------------------------------------


@pytest.fixture
async def recording_proxy(kube_api: KubeApi) -> AsyncIterator[tuple[str, list[tuple[str, str, str]]]]:
    """A reverse proxy in front of the API server that records (method, path, Content-Type); it
    forwards to ``kube_api.url``, plain HTTP on both servers (a kubectl proxy adds credentials)."""
    seen: list[tuple[str, str, str]] = []
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    async def forward(request: web.Request) -> web.StreamResponse:
        seen.append((request.method, request.path, request.headers.get("Content-Type", "")))
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
        async with session.request(
            request.method, kube_api.url + request.path_qs, data=body or None, headers=headers
        ) as upstream:
            return web.Response(
                status=upstream.status,
                body=await upstream.read(),
                headers={"Content-Type": upstream.headers.get("Content-Type", "application/json")},
            )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()
        await session.close()


async def test_custom_resource_patches_are_merge_patches_on_the_wire(
    recording_proxy: tuple[str, list[tuple[str, str, str]]], namespace: str
) -> None:
    url, seen = recording_proxy
    async with KubeClient.from_url(url, request_timeout=10) as kube:
        writer = ApiWriter(kube)
        await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "wire"))
        await writer.patch_merge(EPHEMERAL_RUNNER_SETS, f"{namespace}/wire", {"spec": {"replicas": 3}})
        patched = await writer.patch_status(
            EPHEMERAL_RUNNER_SETS, f"{namespace}/wire", {"status": {"currentReplicas": 2}}
        )
        await writer.create(PODS, pod(namespace, "p"))
        await writer.patch_strategic(PODS, f"{namespace}/p", {"metadata": {"labels": {"a": "b"}}})
        await writer.patch_merge(PODS, f"{namespace}/p", {"metadata": {"labels": {"c": "d"}}})
    patches = [(path.rsplit("/", 2)[-2:], ctype) for method, path, ctype in seen if method == "PATCH"]
    assert patches == [
        (["ephemeralrunnersets", "wire"], "application/merge-patch+json"),
        (["wire", "status"], "application/merge-patch+json"),
        (["pods", "p"], "application/strategic-merge-patch+json"),
        (["pods", "p"], "application/merge-patch+json"),
    ]
    assert patched.spec.replicas == 3 and patched.status is not None and patched.status.current_replicas == 2


async def test_strategic_merge_patch_is_refused_for_custom_resources_before_sending(
    writer: ApiWriter, namespace: str
) -> None:
    with pytest.raises(BadRequest, match="strategic merge patch"):
        await writer.patch_strategic(EPHEMERAL_RUNNER_SETS, f"{namespace}/any", {"spec": {"replicas": 1}})


async def test_merge_patch_replaces_lists_and_null_deletes(
    reader: ApiReader, writer: ApiWriter, namespace: str
) -> None:
    await writer.create(PODS, pod(namespace, "fin"))
    live = await reader.get(PODS, f"{namespace}/fin")
    live = await writer.patch_merge(
        PODS,
        f"{namespace}/fin",
        {"metadata": {"finalizers": ["x/a", "x/b"], "labels": {"k": "v"}}},
        resource_version=live.metadata.resource_version,
    )
    after = await writer.remove_finalizer(PODS, live, "x/a")
    # Under a strategic merge patch the finalizer list would have been unioned, not replaced.
    assert after is not None and after.metadata.finalizers == ["x/b"]
    cleared = await writer.patch_merge(
        PODS, f"{namespace}/fin", {"metadata": {"labels": {"k": None}, "finalizers": None}}
    )
    assert cleared.metadata.labels == {} and cleared.metadata.finalizers == []


# --- optimistic locking --------------------------------------------------------------------------


async def test_two_writers_the_stale_one_conflicts(
    kube_api: KubeApi, reader: ApiReader, writer: ApiWriter, namespace: str
) -> None:
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "race"))
    async with await KubeClient.from_kubeconfig(kube_api.kubeconfig, request_timeout=10) as other:
        seen_by_a = await reader.get(EPHEMERAL_RUNNER_SETS, f"{namespace}/race")
        seen_by_b = await ApiReader(other).get(EPHEMERAL_RUNNER_SETS, f"{namespace}/race")
        rv_a, rv_b = seen_by_a.metadata.resource_version, seen_by_b.metadata.resource_version
        await writer.patch_merge(
            EPHEMERAL_RUNNER_SETS, f"{namespace}/race", {"spec": {"replicas": 5}}, resource_version=rv_a
        )
        with pytest.raises(Conflict) as stale:
            await ApiWriter(other).patch_merge(
                EPHEMERAL_RUNNER_SETS, f"{namespace}/race", {"spec": {"replicas": 7}}, resource_version=rv_b
            )
        assert stale.value.request == f"PATCH ephemeralrunnersets.actions.github.com {namespace}/race"
        with pytest.raises(Conflict):
            await ApiWriter(other).patch_status(
                EPHEMERAL_RUNNER_SETS, f"{namespace}/race", {"status": {"currentReplicas": 1}}, resource_version=rv_b
            )
        # The same patch without a resourceVersion cannot conflict: it silently overwrites.
        blind = await ApiWriter(other).patch_merge(
            EPHEMERAL_RUNNER_SETS, f"{namespace}/race", {"spec": {"replicas": 7}}
        )
        assert blind.spec.replicas == 7
    assert (await reader.get(EPHEMERAL_RUNNER_SETS, f"{namespace}/race")).spec.replicas == 7


async def test_retry_on_conflict_rereads_and_redecides(reader: ApiReader, writer: ApiWriter, namespace: str) -> None:
    key = ObjectKey(namespace, "counter")
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "counter", replicas=1))
    attempts: list[int] = []

    async def increment() -> EphemeralRunnerSet:
        current = await reader.get(EPHEMERAL_RUNNER_SETS, key)
        attempts.append(current.spec.replicas)
        if len(attempts) == 1:  # a concurrent writer slips in between our read and our write
            await writer.patch_merge(
                EPHEMERAL_RUNNER_SETS,
                key,
                {"spec": {"replicas": 10}},
                resource_version=current.metadata.resource_version,
            )
        return await writer.patch_merge(
            EPHEMERAL_RUNNER_SETS,
            key,
            {"spec": {"replicas": current.spec.replicas + 1}},
            resource_version=current.metadata.resource_version,
        )

    result = await retry_on_conflict(increment)
    assert attempts == [1, 10]  # the second attempt decided on the fresh read
    assert result.spec.replicas == 11
    assert (await reader.get(EPHEMERAL_RUNNER_SETS, key)).spec.replicas == 11


async def test_retry_on_conflict_gives_up_after_bounded_attempts(
    reader: ApiReader, writer: ApiWriter, namespace: str
) -> None:
    key = ObjectKey(namespace, "hot")
    created = await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "hot"))
    calls = 0

    async def always_stale() -> None:
        nonlocal calls
        calls += 1
        await writer.patch_merge(
            EPHEMERAL_RUNNER_SETS,
            key,
            {"spec": {"replicas": calls}},
            resource_version=created.metadata.resource_version,
        )

    await writer.patch_merge(EPHEMERAL_RUNNER_SETS, key, {"spec": {"replicas": 2}})
    with pytest.raises(Conflict):
        await retry_on_conflict(always_stale, attempts=3, backoff=0.001)
    assert calls == 3


async def test_retry_on_conflict_refuses_a_lockless_patch(reader: ApiReader, writer: ApiWriter, namespace: str) -> None:
    key = ObjectKey(namespace, "nolock")
    created = await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "nolock"))

    async def lockless() -> None:
        await reader.get(EPHEMERAL_RUNNER_SETS, key)
        await writer.patch_status(EPHEMERAL_RUNNER_SETS, key, {"status": {"finishedRunnerCleanupPatchID": 3}})

    with pytest.raises(LocklessWrite, match="retry_on_conflict"):
        await retry_on_conflict(lockless)

    async def unconditional_delete() -> None:
        await writer.delete(EPHEMERAL_RUNNER_SETS, key)

    with pytest.raises(LocklessWrite):
        await retry_on_conflict(unconditional_delete)
    # Nothing was sent: the object is untouched.
    after = await reader.get(EPHEMERAL_RUNNER_SETS, key)
    assert after.metadata.resource_version == created.metadata.resource_version
    # Outside retry_on_conflict the same lock-less write is allowed (and documented as blind).
    await writer.patch_status(EPHEMERAL_RUNNER_SETS, key, {"status": {"finishedRunnerCleanupPatchID": 3}})


# --- status subresource --------------------------------------------------------------------------


async def test_status_patch_ignores_spec_and_metadata(reader: ApiReader, writer: ApiWriter, namespace: str) -> None:
    created = await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "st", replicas=1))
    patched = await writer.patch_status(
        EPHEMERAL_RUNNER_SETS,
        f"{namespace}/st",
        {
            "spec": {"replicas": 9},
            "metadata": {"labels": {"sneaky": "yes"}},
            "status": {"currentReplicas": 4, "finishedRunnerCleanupPatchID": 0},
        },
        resource_version=created.metadata.resource_version,
    )
    assert patched.spec.replicas == 1 and "sneaky" not in patched.metadata.labels
    assert patched.status is not None and patched.status.current_replicas == 4
    assert patched.status.finished_runner_cleanup_patch_id == 0
    assert patched.metadata.generation == created.metadata.generation
    # A spec patch through the main endpoint leaves status alone.
    spec_patched = await writer.patch_merge(
        EPHEMERAL_RUNNER_SETS, f"{namespace}/st", {"spec": {"replicas": 2}, "status": {"currentReplicas": 99}}
    )
    assert spec_patched.status is not None and spec_patched.status.current_replicas == 4
    assert spec_patched.metadata.generation == created.metadata.generation + 1
    cleared = await writer.patch_status(
        EPHEMERAL_RUNNER_SETS, f"{namespace}/st", {"status": {"finishedRunnerCleanupPatchID": None}}
    )
    assert cleared.status is not None and cleared.status.finished_runner_cleanup_patch_id is None


# --- delete and finalizers -----------------------------------------------------------------------


async def test_delete_with_preconditions(reader: ApiReader, writer: ApiWriter, namespace: str) -> None:
    key = ObjectKey(namespace, "del")
    first = await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "del"))
    await writer.patch_merge(EPHEMERAL_RUNNER_SETS, key, {"spec": {"replicas": 2}})
    with pytest.raises(Conflict, match="ResourceVersion"):
        await writer.delete(EPHEMERAL_RUNNER_SETS, key, resource_version=first.metadata.resource_version)
    with pytest.raises(Conflict, match="UID"):
        await writer.delete(EPHEMERAL_RUNNER_SETS, key, uid="00000000-0000-0000-0000-000000000000")
    assert await writer.delete(EPHEMERAL_RUNNER_SETS, key, uid=first.metadata.uid) is True
    assert await reader.get_or_none(EPHEMERAL_RUNNER_SETS, key) is None
    assert await writer.delete(EPHEMERAL_RUNNER_SETS, key, missing_ok=True) is False
    with pytest.raises(NotFound):
        await writer.delete(EPHEMERAL_RUNNER_SETS, key)


async def test_finalizer_helpers_lock_on_the_read_version(reader: ApiReader, writer: ApiWriter, namespace: str) -> None:
    key = ObjectKey(namespace, "fz")
    created = await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "fz"))
    with_fin = await writer.add_finalizer(EPHEMERAL_RUNNER_SETS, created, "actions.github.com/test")
    assert with_fin.metadata.finalizers == ["actions.github.com/test"]
    again = await writer.add_finalizer(EPHEMERAL_RUNNER_SETS, with_fin, "actions.github.com/test")
    assert again.metadata.resource_version == with_fin.metadata.resource_version  # idempotent, no write
    with pytest.raises(Conflict):  # decided on the pre-finalizer read: stale
        await writer.add_finalizer(EPHEMERAL_RUNNER_SETS, created, "actions.github.com/other")

    await writer.delete(EPHEMERAL_RUNNER_SETS, key)
    deleting = await reader.get(EPHEMERAL_RUNNER_SETS, key)
    assert deleting.metadata.is_deleting
    assert await writer.remove_finalizer(EPHEMERAL_RUNNER_SETS, deleting, "actions.github.com/test") is not None
    assert await reader.get_or_none(EPHEMERAL_RUNNER_SETS, key) is None
    # Removing from an object that is gone is not an error (idempotent handlers).
    assert await writer.remove_finalizer(EPHEMERAL_RUNNER_SETS, deleting, "actions.github.com/test") is None


async def test_delete_propagation_policy_is_sent(reader: ApiReader, writer: ApiWriter, namespace: str) -> None:
    from shared.kube import SECRETS, PropagationPolicy

    owner = await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "owner"))
    ref = {
        "apiVersion": owner.api_version,
        "kind": "EphemeralRunnerSet",
        "name": "owner",
        "uid": owner.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    child = await writer.create(
        SECRETS,
        {
            "metadata": {
                "name": "child",
                "namespace": namespace,
                "ownerReferences": [ref],
                "finalizers": ["runnerscale.test/hold"],
            },
            "stringData": {"k": "v"},
        },
    )
    assert child.decoded("k") == b"v"
    await writer.delete(EPHEMERAL_RUNNER_SETS, f"{namespace}/owner", propagation=PropagationPolicy.FOREGROUND)
    held = await reader.get(EPHEMERAL_RUNNER_SETS, f"{namespace}/owner")
    assert held.metadata.is_deleting and "foregroundDeletion" in held.metadata.finalizers

    async def release_child() -> None:  # the garbage collector writes the child concurrently
        live_child = await reader.get(SECRETS, f"{namespace}/child")
        await writer.remove_finalizer(SECRETS, live_child, "runnerscale.test/hold")

    await retry_on_conflict(release_child)

    async def owner_gone() -> bool:  # the garbage collector is asynchronous
        return await reader.get_or_none(EPHEMERAL_RUNNER_SETS, f"{namespace}/owner") is None

    await eventually(owner_gone, timeout=20, what="the owner deleted")
    assert await reader.get_or_none(SECRETS, f"{namespace}/child") is None


async def test_connect_prefers_in_cluster_config_inside_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from shared.kube import ConnectionFailed

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(ConnectionFailed, match="in-cluster"):  # no service-account token here
        await KubeClient.connect()
    # An explicit kubeconfig wins over the in-cluster environment.
    with pytest.raises(ConnectionFailed, match="kubeconfig"):
        await KubeClient.connect(tmp_path / "absent")


async def test_replace_is_always_conditional(reader: ApiReader, writer: ApiWriter, namespace: str) -> None:
    from shared.kube import SECRETS

    first = await writer.create(SECRETS, {"metadata": {"name": "cfg", "namespace": namespace}, "data": {"a": "MQ=="}})
    first.data = {"a": "Mg=="}
    updated = await writer.replace(SECRETS, first)
    assert updated.decoded("a") == b"2" and updated.metadata.resource_version != first.metadata.resource_version
    with pytest.raises(Conflict):  # first's resourceVersion is stale now
        await writer.replace(SECRETS, first)
    first.metadata.resource_version = ""
    with pytest.raises(BadRequest, match="resourceVersion"):  # an unconditional PUT is refused
        await writer.replace(SECRETS, first)
    assert (await reader.get(SECRETS, f"{namespace}/cfg")).decoded("a") == b"2"
