"""Prometheus metrics of the bus (default registry; each process serves it on its /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REJECTED_MESSAGES = Counter(
    "runnerscale_bus_rejected_messages_total",
    "Messages terminated without reaching a handler because they did not decode",
    ["subject_kind", "reason"],  # reason: malformed | unknown_schema_version
)
HANDLED_MESSAGES = Counter(
    "runnerscale_bus_handled_messages_total",
    "Messages whose handler returned (and were acked)",
    ["subject_kind"],
)
HANDLER_FAILURES = Counter(
    "runnerscale_bus_handler_failures_total",
    "Handler exceptions (the message is nak'ed with backoff, or terminated at max_deliver)",
    ["subject_kind"],
)
DEFERRED_MESSAGES = Counter(
    "runnerscale_bus_deferred_messages_total",
    "Messages a handler asked to get again later (shared.bus.Redeliver: nak'ed with its delay; not a failure)",
    ["subject_kind"],
)
TERMINATED_MESSAGES = Counter(
    "runnerscale_bus_terminated_messages_total",
    "Messages given up on after max_deliver failed deliveries",
    ["subject_kind"],
)
PUBLISHED_MESSAGES = Counter(
    "runnerscale_bus_published_messages_total",
    "Messages acknowledged by JetStream (duplicate=true: dropped by the de-duplication window)",
    ["subject_kind", "duplicate"],
)
PUBLISH_RETRIES = Counter(
    "runnerscale_bus_publish_retries_total",
    "Publish attempts that failed transiently and were retried",
    ["subject_kind"],
)
PUBLISH_FAILURES = Counter(
    "runnerscale_bus_publish_failures_total",
    "Publishes given up on (PublishFailed, or dropped from the outbox)",
    ["subject_kind"],
)
OUTBOX_DEPTH = Gauge("runnerscale_bus_outbox_depth", "Messages waiting in the in-memory outbox")
CONNECTED = Gauge("runnerscale_bus_connected", "1 while the NATS connection is up")
RECONNECTS = Counter("runnerscale_bus_reconnects_total", "Reconnections to NATS")
DELIVERY_LATENCY = Histogram(
    "runnerscale_bus_delivery_latency_seconds",
    "Message time (set by the publisher) to handler start",
    ["subject_kind"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
LEADER = Gauge("runnerscale_bus_leader", "1 while this replica holds the leader lease", ["lease"])
