"""The client-side request rate limit (client-go's QPS/Burst), on a clock the test moves."""

from __future__ import annotations

import pytest

from shared.kube.client import RequestRateLimit


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_burst_goes_at_once_then_requests_are_spaced_at_qps_in_reservation_order() -> None:
    clock = FakeClock()
    limit = RequestRateLimit(qps=20, burst=2, clock=clock)
    delays = [limit.reserve() for _ in range(6)]
    assert delays == pytest.approx([0, 0, 0.05, 0.10, 0.15, 0.20])
    assert limit.throttled == 4


def test_tokens_refill_with_time_up_to_the_burst() -> None:
    clock = FakeClock()
    limit = RequestRateLimit(qps=8, burst=3, clock=clock)  # 1/8 s: exact in binary floating point
    assert [limit.reserve() for _ in range(3)] == [0, 0, 0]
    clock.now += 0.125  # one token back
    assert limit.reserve() == 0
    assert limit.reserve() == pytest.approx(0.125)
    clock.now += 60  # idle: never more than the burst
    assert [limit.reserve() for _ in range(3)] == [0, 0, 0]
    assert limit.reserve() == pytest.approx(0.125)
    assert limit.throttled == 2


def test_zero_qps_disables_the_limit_and_a_limit_needs_a_burst() -> None:
    limit = RequestRateLimit(qps=0, burst=0)
    assert not limit.enabled
    assert all(limit.reserve() == 0 for _ in range(100)) and limit.throttled == 0
    with pytest.raises(ValueError, match="burst"):
        RequestRateLimit(qps=5, burst=0)
