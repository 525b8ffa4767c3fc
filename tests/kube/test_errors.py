"""Error translation: every HTTP status the layer can meet becomes one typed KubeError naming the
request — pure mapping first, then the same through the client against injected faults."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from services.embedded.apiserver import EmulatorControl
from shared.kube import (
    EPHEMERAL_RUNNER_SETS,
    AlreadyExists,
    ApiReader,
    ApiWriter,
    BadRequest,
    Conflict,
    ConnectionFailed,
    DecodeFailed,
    Forbidden,
    Gone,
    Invalid,
    KubeClient,
    KubeError,
    NotFound,
    ServerError,
    Throttled,
    Timeout,
    translate_status,
)
from tests.fixtures.apiserver import KubeApi

from .conftest import ers

pytestmark = pytest.mark.anyio


def status_body(code: int, reason: str, message: str = "msg", **details: Any) -> bytes:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (400, "BadRequest", BadRequest),
        (401, "Unauthorized", Forbidden),
        (403, "Forbidden", Forbidden),
        (404, "NotFound", NotFound),
        (409, "AlreadyExists", AlreadyExists),
        (409, "Conflict", Conflict),
        (410, "Expired", Gone),
        (415, "UnsupportedMediaType", BadRequest),
        (422, "Invalid", Invalid),
        (429, "TooManyRequests", Throttled),
        (500, "InternalError", ServerError),
        (503, "ServiceUnavailable", ServerError),
        (504, "Timeout", Timeout),
        (500, "Timeout", Timeout),
        (418, "Teapot", KubeError),
    ],
)
def test_translate_each_status(code: int, reason: str, expected: type[KubeError]) -> None:
    err = translate_status("GET pods ns/x", code, status_body(code, reason, "the message"))
    assert type(err) is expected
    assert err.status == code and err.reason == reason and err.message == "the message"
    assert str(err).startswith("GET pods ns/x: the message")


def test_invalid_carries_causes() -> None:
    body = status_body(
        422,
        "Invalid",
        "x is invalid",
        name="x",
        kind="Pod",
        causes=[{"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers"}],
    )
    err = translate_status("CREATE pods ns/x", 422, body)
    assert isinstance(err, Invalid)
    assert [(c.field, c.reason) for c in err.causes] == [("spec.containers", "FieldValueRequired")]


def test_throttled_reads_retry_after_from_header_then_details() -> None:
    from_header = translate_status("LIST pods *", 429, status_body(429, "TooManyRequests"), {"Retry-After": "3"})
    assert isinstance(from_header, Throttled) and from_header.retry_after == 3.0
    from_details = translate_status("LIST pods *", 429, status_body(429, "TooManyRequests", retryAfterSeconds=5), {})
    assert isinstance(from_details, Throttled) and from_details.retry_after == 5.0
    unstated = translate_status("LIST pods *", 429, b"", None)
    assert isinstance(unstated, Throttled) and unstated.retry_after is None


def test_a_non_status_body_still_gives_a_typed_error() -> None:
    err = translate_status("GET pods ns/x", 502, b"<html>bad gateway</html>")
    assert isinstance(err, ServerError) and "bad gateway" in err.message
    empty = translate_status("GET pods ns/x", 404, b"")
    assert isinstance(empty, NotFound) and empty.message == "HTTP 404"


# --- through the client against injected faults ------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [(409, Conflict), (429, Throttled), (500, ServerError), (503, ServerError), (504, Timeout), (403, Forbidden)],
)
async def test_injected_statuses_arrive_typed(
    control: EmulatorControl, reader: ApiReader, namespace: str, code: int, expected: type[KubeError]
) -> None:
    control.add_fault(
        action="error",
        code=code,
        verb="get",
        resource="ephemeralrunnersets",
        namespace=namespace,
        retry_after_seconds=2 if code == 429 else 0,
    )
    with pytest.raises(expected) as caught:
        await reader.get(EPHEMERAL_RUNNER_SETS, f"{namespace}/x")
    assert caught.value.request == f"GET ephemeralrunnersets.actions.github.com {namespace}/x"
    if code == 429:
        assert caught.value.retry_after == 2.0  # type: ignore[attr-defined]
    with pytest.raises(NotFound):  # the fault fired once; now the real answer
        await reader.get(EPHEMERAL_RUNNER_SETS, f"{namespace}/x")


async def test_slow_server_gives_timeout(control: EmulatorControl, kube_api: KubeApi, namespace: str) -> None:
    control.add_fault(
        action="latency", delay_seconds=2.0, verb="list", resource="ephemeralrunnersets", namespace=namespace
    )
    async with await KubeClient.from_kubeconfig(kube_api.kubeconfig, request_timeout=0.3) as kube:
        with pytest.raises(Timeout, match=re.escape("no response within 0.3s")):
            await ApiReader(kube).list(EPHEMERAL_RUNNER_SETS, namespace=namespace)


async def test_unreachable_server_gives_connection_failed() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with KubeClient.from_url(f"http://127.0.0.1:{port}", request_timeout=5) as kube:
        with pytest.raises(ConnectionFailed) as caught:
            await ApiReader(kube).get(EPHEMERAL_RUNNER_SETS, "ns/x")
    assert caught.value.request == "GET ephemeralrunnersets.actions.github.com ns/x"


async def test_closed_client_and_bad_kubeconfig(tmp_path: Path, kube: KubeClient) -> None:
    await kube.close()
    await kube.close()  # idempotent
    with pytest.raises(ConnectionFailed, match="closed"):
        await ApiReader(kube).get(EPHEMERAL_RUNNER_SETS, "ns/x")
    with pytest.raises(ConnectionFailed, match="kubeconfig"):
        await KubeClient.from_kubeconfig(tmp_path / "missing")


async def test_response_of_the_wrong_shape_is_decode_failed(
    writer: ApiWriter, reader: ApiReader, namespace: str
) -> None:
    await writer.create(EPHEMERAL_RUNNER_SETS, ers(namespace, "ok"))
    # An object of another kind where an ERS is expected (decoding with the wrong descriptor).
    from shared.kube import AUTOSCALING_RUNNER_SETS, Resource

    wrong: Resource[Any] = Resource(
        EPHEMERAL_RUNNER_SETS.group,
        "v1alpha1",
        "ephemeralrunnersets",
        "AutoscalingRunnerSet",
        AUTOSCALING_RUNNER_SETS.type,
        custom=True,
    )
    with pytest.raises(DecodeFailed, match="invalid"):
        await reader.get(wrong, f"{namespace}/ok")
