"""The event recorder: Events about an object, repeats counted on one Event, best effort."""

from __future__ import annotations

import pytest

from services.embedded.apiserver import EmulatorControl
from shared.kube import (
    EPHEMERAL_RUNNER_SETS,
    EVENTS,
    ApiReader,
    ApiWriter,
    EventRecorder,
    EventType,
    InvolvedObject,
    retry_on_conflict,
)
from shared.kube.events import event_name

from .conftest import ers

pytestmark = pytest.mark.anyio


def test_event_names_follow_client_go() -> None:
    assert event_name("runner-a", 0x17E1234ABCD) == "runner-a.17e1234abcd"


async def test_repeats_are_counted_on_one_event(reader: ApiReader, writer: ApiWriter, namespace: str) -> None:
    target = await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "evt"))
    recorder = EventRecorder(writer, "runner-set-worker")
    for _ in range(3):
        await recorder.warning(target, "ScaleUpSuppressed", "patch 4 already serviced")
    await recorder.normal(target, "RunnerCreated", "created runner evt-x")

    events = (await reader.list(EVENTS, namespace=namespace)).items
    by_reason = {e.reason: e for e in events}
    assert sorted(by_reason) == ["RunnerCreated", "ScaleUpSuppressed"] and len(events) == 2
    suppressed = by_reason["ScaleUpSuppressed"]
    assert suppressed.count == 3 and suppressed.type == "Warning"
    assert suppressed.metadata.name.startswith("evt.")
    involved = suppressed.involved_object
    assert (involved.kind, involved.api_version, involved.namespace, involved.name, involved.uid) == (
        "EphemeralRunnerSet",
        "actions.github.com/v1alpha1",
        namespace,
        "evt",
        target.metadata.uid,
    )
    assert suppressed.source.component == "runner-set-worker"
    assert suppressed.last_timestamp is not None and suppressed.first_timestamp is not None
    assert suppressed.last_timestamp >= suppressed.first_timestamp
    assert by_reason["RunnerCreated"].count == 1 and by_reason["RunnerCreated"].type == "Normal"


async def test_a_vanished_event_is_recreated_and_inside_retry_it_is_allowed(
    reader: ApiReader, writer: ApiWriter, namespace: str
) -> None:
    recorder = EventRecorder(writer, "w")
    who = InvolvedObject("v1", "Pod", namespace, "p")
    await recorder.event(who, EventType.NORMAL, "Started", "x")
    (first,) = (await reader.list(EVENTS, namespace=namespace)).items
    await writer.delete(EVENTS, f"{namespace}/{first.metadata.name}")

    async def decide_and_record() -> None:  # events are best-effort writes, not refused here
        await recorder.event(who, EventType.NORMAL, "Started", "x")

    await retry_on_conflict(decide_and_record)
    (again,) = (await reader.list(EVENTS, namespace=namespace)).items
    assert again.count == 1 and again.metadata.name != first.metadata.name


async def test_recording_failures_are_swallowed(
    control: EmulatorControl, reader: ApiReader, writer: ApiWriter, namespace: str
) -> None:
    control.add_fault(action="error", code=500, verb="create", resource="events", namespace=namespace, times=1)
    recorder = EventRecorder(writer, "w")
    who = InvolvedObject("v1", "Pod", namespace, "p")
    await recorder.warning(who, "Boom", "lost")  # no exception reaches the reconcile
    assert (await reader.list(EVENTS, namespace=namespace)).items == []
    await recorder.warning(who, "Boom", "lost")
    assert [e.count for e in (await reader.list(EVENTS, namespace=namespace)).items] == [1]


async def test_a_terminating_namespace_gets_one_refused_write_then_none(
    control: EmulatorControl, reader: ApiReader, writer: ApiWriter, namespace: str
) -> None:
    """403 "being terminated": the recorder stops writing into that namespace (one log line), instead
    of one refused write and one warning per Event, forever (issue 11)."""
    control.add_fault(
        action="error",
        code=403,
        verb="create",
        resource="events",
        namespace=namespace,
        times=0,
        message=f"unable to create new content in namespace {namespace} because it is being terminated",
    )
    control.reset_request_counts()
    recorder = EventRecorder(writer, "w")
    for i in range(5):
        await recorder.warning(InvolvedObject("v1", "Pod", namespace, f"p{i}"), "Boom", f"lost {i}")
    creates = [c["count"] for c in control.request_counts() if c["resource"] == "events" and c["verb"] == "create"]
    assert creates == [1]
    control.clear_faults()
