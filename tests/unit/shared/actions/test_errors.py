"""Error classification and that no secret reaches an error text."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from shared.actions import (
    ActionsHTTPError,
    AuthenticationError,
    JobStillRunningError,
    MessageNotFoundError,
    RateLimitedError,
    RunnerExistsError,
    RunnerNotFoundError,
    ScaleSetExistsError,
    ScaleSetNotFoundError,
    ServiceUnavailableError,
    SessionConflictError,
    SessionNotFoundError,
    TokenExpiredError,
)
from shared.actions.http import HttpResponse, Surface, classify_error, describe_request
from shared.log import register_secret
from tests.support.paths import TEST_DATA

DATA = TEST_DATA / "actions"


def response(
    status: int, body: bytes | str = b"", content_type: str = "application/json; charset=utf-8", **headers: str
) -> HttpResponse:
    raw = body.encode() if isinstance(body, str) else body
    h = CIMultiDict({"Content-Type": content_type, **headers})
    return HttpResponse(status=status, headers=CIMultiDictProxy(h), body=raw, request="POST broker/_apis/x")


@pytest.mark.parametrize(
    ("fixture", "status", "expected"),
    [
        ("error_agent_exists.json", 409, RunnerExistsError),
        ("error_agent_not_found.json", 404, RunnerNotFoundError),
        ("error_job_still_running.json", 400, JobStillRunningError),
        ("error_job_still_running.json", 409, JobStillRunningError),
        ("error_session_conflict.json", 409, SessionConflictError),
        ("error_scale_set_not_found.json", 404, ScaleSetNotFoundError),
        ("error_scale_set_exists.json", 409, ScaleSetExistsError),
        ("error_message_not_found.json", 404, MessageNotFoundError),
        # A generic RunnerAdminException is not a class by name; the endpoint's status map decides.
        ("error_session_not_found.json", 404, ActionsHTTPError),
    ],
)
def test_type_name_decides_the_class(fixture: str, status: int, expected: type) -> None:
    error = classify_error(response(status, (DATA / fixture).read_bytes()), surface=Surface.ADMIN)
    assert type(error) is expected
    assert error.status == status
    doc = json.loads((DATA / fixture).read_text())
    assert error.type_name == doc["typeName"]
    assert error.service_message == doc["message"]


def test_endpoint_status_map_applies_when_the_name_is_unknown() -> None:
    body = (DATA / "error_session_not_found.json").read_bytes()
    error = classify_error(response(404, body), surface=Surface.ADMIN, status_errors={404: SessionNotFoundError})
    assert isinstance(error, SessionNotFoundError)
    assert "RunnerAdminException" in str(error)


def test_type_name_wins_over_the_status_map() -> None:
    body = (DATA / "error_scale_set_not_found.json").read_bytes()
    error = classify_error(response(404, body), surface=Surface.QUEUE, status_errors={404: SessionNotFoundError})
    assert isinstance(error, ScaleSetNotFoundError)


@pytest.mark.parametrize(
    ("status", "surface", "expected"),
    [
        (429, Surface.ADMIN, RateLimitedError),
        (500, Surface.ADMIN, ServiceUnavailableError),
        (503, Surface.QUEUE, ServiceUnavailableError),
        (401, Surface.REST, AuthenticationError),
        (403, Surface.REST, AuthenticationError),
        (401, Surface.ADMIN, TokenExpiredError),
        (403, Surface.ADMIN, ActionsHTTPError),
        (400, Surface.ADMIN, ActionsHTTPError),
    ],
)
def test_status_classes(status: int, surface: str, expected: type) -> None:
    assert type(classify_error(response(status, b""), surface=surface)) is expected


def test_text_plain_body_is_the_message() -> None:
    error = classify_error(
        response(400, "capacity must be >= 0", content_type="text/plain; charset=utf-8"), surface=Surface.QUEUE
    )
    assert error.service_message == "capacity must be >= 0" and error.type_name == ""


def test_non_json_body_is_quoted_truncated() -> None:
    error = classify_error(
        response(502, "<html>" + "x" * 5000 + "</html>", content_type="text/html"), surface=Surface.ADMIN
    )
    assert isinstance(error, ServiceUnavailableError)
    assert error.service_message.startswith("<html>") and len(error.service_message) == 500


def test_empty_body_is_unknown_error() -> None:
    assert classify_error(response(418), surface=Surface.ADMIN).service_message == "unknown error"


def test_diagnostic_ids_are_in_the_error() -> None:
    error = classify_error(
        response(500, b"", ActivityId="act-1", **{"X-GitHub-Request-Id": "gh-2"}), surface=Surface.ADMIN
    )
    assert (error.activity_id, error.github_request_id) == ("act-1", "gh-2")
    assert "activity_id=act-1" in str(error) and "github_request_id=gh-2" in str(error)
    assert "POST broker/_apis/x" in str(error)


def test_retry_after_hint_is_kept_on_rate_limit() -> None:
    error = classify_error(response(429), surface=Surface.ADMIN, retry_after=42.0)
    assert isinstance(error, RateLimitedError) and error.retry_after == 42.0


def test_registered_secrets_never_appear_in_error_text() -> None:
    secret = "ghs_secretvalue_for_error_redaction_test"
    register_secret(secret)
    body = json.dumps({"typeName": "X", "message": f"token {secret} is invalid"})
    error = classify_error(response(400, body), surface=Surface.ADMIN)
    assert secret not in str(error) and secret not in error.service_message
    assert "[redacted]" in str(error)


def test_request_description_drops_the_query_string() -> None:
    text = describe_request("get", "https://broker.example/scalesets/message?token=abcdef&lastMessageId=3")
    assert text == "GET broker.example/scalesets/message"
    assert describe_request("DELETE", "http://127.0.0.1:8080/x/1") == "DELETE 127.0.0.1:8080/x/1"
