"""A service message that does not decode: the error names the envelope's id and type, and the
session loop re-publishes the last good level, then acknowledges it (or, without an id, cannot)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import msgspec
import pytest

from services.listener.health import HealthState
from services.listener.loop import Identity, SessionLoop
from services.listener.metrics import ListenerMetrics
from shared.actions import MessageSessionClient
from shared.actions.messages import MessageDecodeError, decode_message
from shared.actions.models import ScaleSetStatistics
from shared.bus import BusMessage
from shared.bus import messages as bus

pytestmark = pytest.mark.anyio

STATS = {"totalAssignedJobs": 9}


def envelope(**fields: object) -> bytes:
    return msgspec.json.encode(
        {"messageId": 41, "messageType": "RunnerScaleSetJobMessages", "body": "", "statistics": STATS, **fields}
    )


@pytest.mark.parametrize(
    ("data", "reason", "message_id", "message_type"),
    [
        (envelope(body="[{oops"), "malformed_body", 41, "RunnerScaleSetJobMessages"),
        (
            envelope(body='[{"messageType": "JobStarted", "runnerId": "x"}]'),
            "malformed_body",
            41,
            "RunnerScaleSetJobMessages",
        ),
        (envelope(messageType="Other"), "unsupported_message_type", 41, "Other"),
        (envelope(statistics=None), "missing_statistics", 41, "RunnerScaleSetJobMessages"),
        (b"{not json", "malformed_envelope", None, ""),
        (b"", "malformed_envelope", None, ""),
    ],
)
def test_decode_error_names_the_envelope(data: bytes, reason: str, message_id: int | None, message_type: str) -> None:
    with pytest.raises(MessageDecodeError) as info:
        decode_message(data, request="GET /queue")
    assert (info.value.reason, info.value.message_id, info.value.message_type) == (reason, message_id, message_type)
    assert "(GET /queue)" in str(info.value)


class FakeSession:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    async def delete_message(self, message_id: int) -> None:
        self.calls.append(("delete", message_id))


def make_loop(session: FakeSession, published: list[BusMessage]) -> SessionLoop:
    async def publish(messages: Sequence[BusMessage]) -> None:
        session.calls.append(("publish", len(messages)))
        published.extend(messages)

    ident = Identity(
        scale_set_id=7, scale_set=bus.ResourceRef(namespace="ns", name="set"), ers=bus.ResourceRef(namespace="ns", name="set"),
        min_runners=1, max_runners=10,
    )  # fmt: skip
    client = cast(MessageSessionClient, session)  # a double of the one method reject() calls
    loop = SessionLoop(ident=ident, session_client=client, publish=publish, metrics=ListenerMetrics(name="set", namespace="ns"),
                       health=HealthState(), epoch=3)  # fmt: skip
    loop.latest_statistics = ScaleSetStatistics(total_assigned_jobs=2)
    return loop


def rejected(loop: SessionLoop, reason: str) -> float | None:
    labels = {
        "name": "set",
        "namespace": "ns",
        "repository": "",
        "organization": "",
        "enterprise": "",
        "reason": reason,
    }
    return loop.metrics.registry.get_sample_value("runnerscale_listener_rejected_messages_total", labels)


async def test_reject_publishes_the_last_good_level_then_acknowledges() -> None:
    session, published = FakeSession(), list[BusMessage]()
    loop = make_loop(session, published)
    error = MessageDecodeError(
        "message 41: body is not a JSON array", message_id=41, message_type="RunnerScaleSetJobMessages"
    )
    await loop.reject(error)
    await loop.reject(error)  # delivered again (e.g. the ack was lost): counted once
    assert session.calls == [("publish", 1), ("delete", 41), ("publish", 1), ("delete", 41)]
    assert all(isinstance(d, bus.DesiredState) for d in published)
    assert [(d.replicas, d.statistics.total_assigned_jobs) for d in published if isinstance(d, bus.DesiredState)] == [
        (3, 2),
        (3, 2),
    ]
    assert loop.last_message_id == 41
    assert rejected(loop, "malformed_body") == 1
    assert loop.health.last_poll_ok is not None


async def test_reject_without_an_id_cannot_acknowledge_and_propagates() -> None:
    session, published = FakeSession(), list[BusMessage]()
    loop = make_loop(session, published)
    with pytest.raises(MessageDecodeError):
        await loop.reject(MessageDecodeError("message envelope is invalid", reason="malformed_envelope"))
    assert session.calls == [] and published == []
    assert rejected(loop, "malformed_envelope") == 1
