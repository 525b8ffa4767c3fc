"""Backoff decisions of the bus client: publish retries and reconnects."""

from shared.bus.bus import backoff_delay, reconnect_delay


def test_publish_backoff_doubles_and_is_capped() -> None:
    assert [backoff_delay(n) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]


def test_reconnect_delay_starts_small_doubles_and_is_capped() -> None:
    assert reconnect_delay(0, 1.0, 0.0) == 0.0
    assert reconnect_delay(0, 1.0, 0.99) < 1.0
    assert [reconnect_delay(n, 1.0, 1.0) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert reconnect_delay(3, 1.0, 0.0) == 2.0  # jitter spreads between half and the full wait
