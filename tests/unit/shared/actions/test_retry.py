"""Retry decisions of the reference policy, as pure functions."""

from __future__ import annotations

import datetime as dt

import pytest

from shared.actions.retry import RetryPolicy, backoff_delay, parse_retry_after, should_retry_status


@pytest.mark.parametrize("status", [0, 429, 500, 502, 503, 504, 599])
def test_retried_statuses(status: int) -> None:
    assert should_retry_status(status)


@pytest.mark.parametrize("status", [200, 201, 202, 204, 400, 401, 403, 404, 409, 422, 501])
def test_not_retried_statuses(status: int) -> None:
    assert not should_retry_status(status)


def test_registration_exchange_also_retries_401_and_403() -> None:
    extra = frozenset({401, 403})
    assert should_retry_status(401, extra=extra) and should_retry_status(403, extra=extra)
    assert not should_retry_status(404, extra=extra)


def test_exponential_backoff_is_1_2_4_8_capped() -> None:
    policy = RetryPolicy()
    assert [backoff_delay(a, policy) for a in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_delay(10, policy) == 30.0
    assert backoff_delay(3, RetryPolicy(backoff_base=0.01, backoff_max=0.05)) == 0.05


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_replaces_the_backoff_on_429_and_503(status: int) -> None:
    assert backoff_delay(0, RetryPolicy(), status=status, retry_after=7.0) == 7.0


def test_retry_after_is_ignored_on_other_statuses() -> None:
    assert backoff_delay(1, RetryPolicy(), status=500, retry_after=7.0) == 2.0


def test_parse_retry_after_seconds_and_http_date() -> None:
    now = dt.datetime(2026, 1, 1, 0, 0, 0, tzinfo=dt.UTC)
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("Thu, 01 Jan 2026 00:00:10 GMT", now=now) == 10.0
    assert parse_retry_after("Wed, 31 Dec 2025 00:00:00 GMT", now=now) == 0.0  # past date: retry now
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("-1") is None
