"""The runner worker's async shell with fakes (no servers): the paths scenario tests cannot
stage deterministically — a Secret written concurrently, name collisions, removal give-up."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from services.runner.decide import RunnerSettings
from services.runner.reconciler import OWN_FINALIZERS, RunnerReconciler, _Stop
from shared.actions import (
    ActionsClient,
    JitRunnerConfig,
    JobStillRunningError,
    RunnerExistsError,
    RunnerNotFoundError,
    RunnerReference,
)
from shared.api import EphemeralRunner, decode
from shared.clock import ManualClock
from shared.kube import (
    EPHEMERAL_RUNNERS,
    PODS,
    SECRETS,
    AlreadyExists,
    ApiReader,
    ApiWriter,
    EventRecorder,
    ObjectKey,
    Resource,
    Result,
)
from shared.kube.objects import Pod, Secret

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def er(status: dict[str, Any] | None = None, deleting: bool = False) -> EphemeralRunner:
    meta: dict[str, Any] = {"name": "r", "namespace": "ns", "uid": "er-uid", "resourceVersion": "7"}
    if deleting:
        meta["deletionTimestamp"] = (NOW - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return decode(
        EphemeralRunner,
        {
            "apiVersion": "actions.github.com/v1alpha1",
            "kind": "EphemeralRunner",
            "metadata": meta,
            "spec": {
                "githubConfigUrl": "https://github.com/o",
                "githubConfigSecret": "s",
                "runnerScaleSetId": 1,
                "spec": {"containers": [{"name": "runner", "image": "i"}]},
            },
            "status": status or {},
        },
    )


def secret(runner_id: str) -> Secret:
    return Secret(
        metadata=decode_meta("r", "sec-uid"),
        data={"runnerId": base64.b64encode(runner_id.encode()).decode(), "jitToken": "eA=="},
    )


def decode_meta(name: str, uid: str) -> Any:
    from shared.api import ObjectMeta

    return ObjectMeta(name=name, namespace="ns", uid=uid)


class FakeReader:
    def __init__(self, objects: dict[Any, Any] | None = None) -> None:
        self.objects = objects or {}
        self.gets: list[Any] = []

    async def get_or_none(self, resource: Resource[Any], key: ObjectKey | str, **kw: Any) -> Any:
        self.gets.append(resource)
        return self.objects.get(resource)

    async def get(self, resource: Resource[Any], key: ObjectKey | str, **kw: Any) -> Any:
        obj = self.objects.get(resource)
        assert obj is not None
        return obj


class FakeWriter:
    def __init__(self, create_error: Exception | None = None) -> None:
        self.calls: list[tuple[str, Any, Any]] = []
        self.create_error = create_error

    async def create(self, resource: Resource[Any], body: Any, **kw: Any) -> Any:
        self.calls.append(("create", resource, body))
        if self.create_error is not None:
            raise self.create_error
        return body

    async def delete(self, resource: Resource[Any], key: ObjectKey | str, **kw: Any) -> bool:
        self.calls.append(("delete", resource, kw))
        return True


class FakeEvents:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def warning(self, obj: object, reason: str, message: str) -> None:
        self.seen.append((reason, message))

    async def normal(self, obj: object, reason: str, message: str) -> None:
        self.seen.append((reason, message))


class FakeClient:
    def __init__(
        self,
        *,
        jit_error: Exception | None = None,
        found: RunnerReference | None = None,
        remove_error: Exception | None = None,
    ) -> None:
        self.jit_error = jit_error
        self.found = found
        self.remove_error = remove_error
        self.removed: list[int] = []

    async def generate_jit_config(self, scale_set_id: int, name: str, *, work_folder: str = "") -> JitRunnerConfig:
        if self.jit_error is not None:
            raise self.jit_error
        return JitRunnerConfig(
            runner=RunnerReference(id=9, name=name, runner_scale_set_id=scale_set_id), encoded_jit_config="ZW5j"
        )

    async def get_runner_by_name(self, name: str) -> RunnerReference | None:
        return self.found

    async def remove_runner(self, runner_id: int) -> None:
        self.removed.append(runner_id)
        if self.remove_error is not None:
            raise self.remove_error


class FakeClients:
    def __init__(self, client: FakeClient | None = None, error: Exception | None = None) -> None:
        self.client = client
        self.error = error

    async def for_spec(self, namespace: str, spec: Any) -> ActionsClient:
        if self.error is not None:
            raise self.error
        # A double of the calls the reconciler makes, not an ActionsClient.
        return cast(ActionsClient, self.client)


def reconciler(
    reader: FakeReader | None = None,
    writer: FakeWriter | None = None,
    client: FakeClient | None = None,
    clients: FakeClients | None = None,
    **settings: Any,
) -> tuple[RunnerReconciler, FakeEvents]:
    events = FakeEvents()
    # The doubles answer only the calls the reconciler makes; they are not the concrete classes.
    rec = RunnerReconciler(
        cast(ApiReader, reader or FakeReader()),
        cast(ApiWriter, writer or FakeWriter()),
        cast(EventRecorder, events),
        clients or FakeClients(client or FakeClient()),
        RunnerSettings(**settings),
        clock=ManualClock(NOW),
    )
    return rec, events


async def test_secret_written_concurrently_for_another_registration_is_replaced() -> None:
    reader = FakeReader({SECRETS: None})
    writer = FakeWriter(create_error=AlreadyExists("POST secrets", "exists"))
    rec, _ = reconciler(reader, writer)
    reader.objects[SECRETS] = None

    async def get(resource: Resource[Any], key: ObjectKey | str, **kw: Any) -> Secret:
        return secret("5")

    reader.get = get  # type: ignore[method-assign]  # this test's answer replaces the fake's
    with pytest.raises(_Stop) as stop:
        await rec._ensure_secret(er())
    assert stop.value.result == Result(requeue_after=0.0)
    assert ("delete", SECRETS, {"uid": "sec-uid", "missing_ok": True}) in writer.calls


async def test_secret_written_concurrently_for_our_registration_is_kept() -> None:
    reader = FakeReader()
    writer = FakeWriter(create_error=AlreadyExists("POST secrets", "exists"))
    rec, _ = reconciler(reader, writer)

    async def get(resource: Resource[Any], key: ObjectKey | str, **kw: Any) -> Secret:
        return secret("9")

    reader.get = get  # type: ignore[method-assign]  # this test's answer replaces the fake's
    got = await rec._ensure_secret(er())
    assert got.metadata.uid == "sec-uid"
    assert not [c for c in writer.calls if c[0] == "delete"]


@pytest.mark.parametrize(
    ("found", "removed", "result", "er_deleted"),
    [
        (None, [], Result(requeue_after=0.5), False),
        (RunnerReference(id=3, name="r", runner_scale_set_id=1), [3], Result(requeue_after=0.5), False),
        (RunnerReference(id=3, name="r", runner_scale_set_id=2), [], Result(), True),
    ],
)
async def test_runner_exists_resolution(
    found: RunnerReference | None, removed: list[int], result: Result, er_deleted: bool
) -> None:
    client = FakeClient(jit_error=RunnerExistsError("POST x", status=409), found=found)
    writer = FakeWriter()
    rec, events = reconciler(FakeReader(), writer, client, runner_exists_requeue=0.5)
    with pytest.raises(_Stop) as stop:
        await rec._ensure_secret(er())
    assert stop.value.result == result
    assert client.removed == removed
    assert any(c[0] == "delete" and c[1] is EPHEMERAL_RUNNERS for c in writer.calls) is er_deleted
    if er_deleted:
        assert events.seen[0][0] == "RunnerNameTaken"


async def test_removal_without_id_secret_or_client_counts_as_done() -> None:
    rec, _ = reconciler(
        FakeReader({SECRETS: None}), clients=FakeClients(error=RuntimeError("Secret s in namespace ns: not found"))
    )
    await rec._remove_runner(er(deleting=True))  # no raise


async def test_removal_with_known_id_and_no_client_is_an_error() -> None:
    rec, events = reconciler(
        FakeReader(), clients=FakeClients(error=RuntimeError("Secret s in namespace ns: not found"))
    )
    with pytest.raises(RuntimeError):
        await rec._remove_runner(er({"runnerId": 4}, deleting=True))
    assert events.seen[0][0] == "ActionsCredentialsUnavailable"


async def test_removal_by_name_only_in_this_scale_set() -> None:
    other = FakeClient(found=RunnerReference(id=3, name="r", runner_scale_set_id=2))
    rec, _ = reconciler(FakeReader({SECRETS: None}), client=other)
    await rec._remove_runner(er(deleting=True))
    assert other.removed == []
    ours = FakeClient(
        found=RunnerReference(id=3, name="r", runner_scale_set_id=1),
        remove_error=RunnerNotFoundError("DELETE x", status=404),
    )
    rec, _ = reconciler(FakeReader({SECRETS: None}), client=ours)
    await rec._remove_runner(er(deleting=True))
    assert ours.removed == [3]


def _pod(phase: str, running: bool) -> Pod:
    import msgspec

    st: dict[str, Any] = {"phase": phase}
    if running:
        st["containerStatuses"] = [{"name": "runner", "state": {"running": {}}}]
    return msgspec.json.decode(
        msgspec.json.encode({"metadata": {"name": "r", "namespace": "ns", "uid": "p"}, "status": st}), type=Pod
    )


@pytest.mark.parametrize(("pod", "expected"), [(None, None), (_pod("Running", True), Result(requeue_after=30.0))])
async def test_busy_runner_removal_waits_unless_its_pod_is_gone_for_long(
    pod: Pod | None, expected: Result | None
) -> None:
    client = FakeClient(remove_error=JobStillRunningError("DELETE x", status=400))
    rec, events = reconciler(FakeReader({PODS: pod}), client=client)
    assert await rec._unregister(er({"runnerId": 4}, deleting=True)) == expected
    assert ("RunnerRemovalAbandoned" in [r for r, _ in events.seen]) is (expected is None)


async def test_finalizers_already_set_are_not_written() -> None:
    """Issue 10: the runner-set may create ERs with both finalizers already set; the runner
    worker then writes none (FakeWriter has no patch method: a patch would raise)."""
    writer = FakeWriter()
    rec, _ = reconciler(writer=writer)
    runner = er()
    runner.metadata.finalizers = list(OWN_FINALIZERS)
    assert await rec._ensure_finalizers(runner) is runner
    assert writer.calls == []


def cached_reconciler(cache: dict[ObjectKey, EphemeralRunner]) -> tuple[RunnerReconciler, FakeReader, FakeWriter]:
    reader, writer = FakeReader({EPHEMERAL_RUNNERS: er()}), FakeWriter()
    rec = RunnerReconciler(
        cast(ApiReader, reader),
        cast(ApiWriter, writer),
        cast(EventRecorder, FakeEvents()),
        FakeClients(FakeClient()),
        RunnerSettings(),
        clock=ManualClock(NOW),
        cached_er=cache.get,
        cached_pod=lambda key: None,
    )
    return rec, reader, writer


async def test_a_pass_for_a_key_missing_from_the_cache_reads_and_writes_nothing() -> None:
    """Gone (its delete or its pod's garbage collection woke the pass) or not cached yet (its add
    wakes the key again): no GET, no write; a re-run after a 409 still reads the server."""
    from shared.kube import DONE, ReconcileContext

    rec, reader, writer = cached_reconciler({})
    key = ObjectKey("ns", "r")
    # Never seen by this worker: read from the server (an ER the informer cannot decode).
    reader.objects = {}
    assert await rec.reconcile(key, ReconcileContext.direct()) == DONE
    assert reader.gets == [EPHEMERAL_RUNNERS]
    reader.gets.clear()
    rec._gone.clear()
    rec._seen_rv[key] = 7  # seen (its writes' answers), now missing from the cache: gone
    assert await rec.reconcile(key, ReconcileContext.direct()) == DONE
    assert reader.gets == [] and writer.calls == []
    assert key in rec._gone and key not in rec._seen_rv  # nothing kept for a gone ER but the bounded mark
    assert await rec.reconcile(key, ReconcileContext.direct()) == DONE  # the pod's GC wakes it again
    assert reader.gets == []
    # A second attempt (after a 409) reads the server.
    import dataclasses

    assert await rec.reconcile(key, dataclasses.replace(ReconcileContext.direct(), attempt=2)) == DONE
    assert reader.gets == [EPHEMERAL_RUNNERS] and writer.calls == []


async def test_a_job_event_for_a_gone_runner_reads_nothing_while_the_cache_lacks_it() -> None:
    from shared.bus import ResourceRef
    from shared.bus.messages import JobCompleted
    from shared.kube import ReconcileContext

    cache: dict[ObjectKey, EphemeralRunner] = {}
    rec, reader, writer = cached_reconciler(cache)
    key = ObjectKey("ns", "r")
    event = JobCompleted(
        scale_set_id=1, scale_set=ResourceRef("ns", "set"), runner_name="r", runner_id=9, job_id="j", result="succeeded"
    )
    # Not known as gone: decided on a GET (the cache may lag an ER this replica never saw).
    reader.objects = {}
    assert await rec.handle_job_event(event, delivery=3) == "unknown_runner"
    assert reader.gets == [EPHEMERAL_RUNNERS]
    # A pass found it missing from the cache: its redelivered events read nothing.
    reader.gets.clear()
    await rec.reconcile(key, ReconcileContext.direct())
    assert await rec.handle_job_event(event, delivery=3) == "unknown_runner"
    assert reader.gets == [] and writer.calls == []
    # A direct call (no delivery) still reads the server.
    assert await rec.handle_job_event(event) == "unknown_runner"
    assert reader.gets == [EPHEMERAL_RUNNERS]
    # Back in the cache (a namesake): decided as usual (its runner id differs: on a GET), not dropped.
    reader.gets.clear()
    cache[key] = er()
    await rec.handle_job_event(event, delivery=3)
    assert reader.gets == [EPHEMERAL_RUNNERS]
