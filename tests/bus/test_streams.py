"""Streams, consumers and buckets are created idempotently; a conflicting existing one is an error."""

import msgspec
import nats
import pytest

from shared.bus import (
    Bus,
    BusConfigConflict,
    BusSettings,
    BusUnavailable,
    Delivery,
    LeaderLease,
    ShardOwnership,
    subjects,
)
from shared.bus.bus import consumer_config, stream_config
from tests.fixtures.nats import NatsServer

pytestmark = pytest.mark.anyio


async def test_setup_is_idempotent_and_creates_everything(bus_settings: BusSettings) -> None:
    async with Bus.connect(bus_settings):
        pass
    async with Bus.connect(bus_settings) as bus:  # second start-up: no error, no change
        for spec in subjects.STREAMS:
            info = await bus.js.stream_info(spec.name)
            assert info.config.subjects == list(spec.subjects)
        desired = await bus.js.stream_info(subjects.DESIRED_STREAM.name)
        assert desired.config.max_msgs_per_subject == bus_settings.history
        for bucket in subjects.BUCKET_SPECS:
            info = await bus.js.stream_info(f"KV_{bucket.name}")
            assert info.config.max_age == pytest.approx(bus_settings.lease_ttl if bucket.lease else 0)
            assert info.config.max_msgs_per_subject == 1
        assert subjects.SESSIONS_BUCKET in subjects.BUCKETS


async def test_a_sessions_bucket_made_by_an_earlier_listener_is_accepted(
    bus_settings: BusSettings, nats_server: NatsServer
) -> None:
    """Listeners used to create the sessions bucket themselves (history 1, no TTL, default
    storage): the bus set-up accepts such a bucket and keeps its records."""
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().create_key_value(
            nats.js.api.KeyValueConfig(
                bucket=subjects.SESSIONS_BUCKET, history=1, description="runnerscale listener message sessions"
            )
        )
        await kv.put(subjects.listener_session_key(7), b'{"sessionId": "s-1"}')
    finally:
        await nc.close()
    async with Bus.connect(bus_settings) as bus:
        kv = await bus.key_value(subjects.SESSIONS_BUCKET)
        assert (await kv.get(subjects.listener_session_key(7))).value == b'{"sessionId": "s-1"}'


async def test_a_sessions_bucket_with_a_ttl_is_a_startup_error(
    bus_settings: BusSettings, nats_server: NatsServer
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        await nc.jetstream().create_key_value(
            nats.js.api.KeyValueConfig(bucket=subjects.SESSIONS_BUCKET, history=1, ttl=60)
        )
    finally:
        await nc.close()
    with pytest.raises(BusConfigConflict, match=r"runnerscale_listener_sessions.*ttl"):
        async with Bus.connect(bus_settings):
            pass


async def test_tunable_limits_are_updated_in_place(bus_settings: BusSettings) -> None:
    async with Bus.connect(bus_settings):
        pass
    deeper = msgspec.structs.replace(bus_settings, history=25)
    async with Bus.connect(deeper) as bus:
        info = await bus.js.stream_info(subjects.DESIRED_STREAM.name)
        assert info.config.max_msgs_per_subject == 25


async def test_a_guest_connection_creates_missing_streams_but_never_retunes_existing_ones(
    bus_settings: BusSettings,
) -> None:
    """The listener connects with tune_existing=False: its config lacks the cluster's sizing, so
    it must not flip the workers' stream settings back to defaults on every start."""
    workers = msgspec.structs.replace(bus_settings, history=25)
    async with Bus.connect(workers):
        pass
    async with Bus.connect(bus_settings, tune_existing=False) as bus:
        info = await bus.js.stream_info(subjects.DESIRED_STREAM.name)
        assert info.config.max_msgs_per_subject == 25
        await bus.js.delete_stream(subjects.JOBS_STREAM.name)
    async with Bus.connect(bus_settings, tune_existing=False) as bus:  # a missing stream is still created
        info = await bus.js.stream_info(subjects.JOBS_STREAM.name)
        assert info.config.subjects == list(subjects.JOBS_STREAM.subjects)


async def test_a_stream_with_other_subjects_is_a_startup_error(
    bus_settings: BusSettings, nats_server: NatsServer
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=subjects.DESIRED_STREAM.name, subjects=["somebody.else.>"])
    finally:
        await nc.close()
    with pytest.raises(BusConfigConflict, match=r"RUNNERSCALE_DESIRED.*subjects"):
        async with Bus.connect(bus_settings):
            pass


async def test_a_stream_with_other_retention_is_a_startup_error(
    bus_settings: BusSettings, nats_server: NatsServer
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        config = stream_config(subjects.JOBS_STREAM, bus_settings)
        config.retention = nats.js.api.RetentionPolicy.WORK_QUEUE
        await nc.jetstream().add_stream(config)
    finally:
        await nc.close()
    with pytest.raises(BusConfigConflict, match="retention"):
        async with Bus.connect(bus_settings):
            pass


async def test_a_lease_bucket_with_another_ttl_is_a_startup_error(bus_settings: BusSettings) -> None:
    async with Bus.connect(bus_settings):
        pass
    longer = msgspec.structs.replace(bus_settings, lease_ttl=30.0, renew_interval=0)
    with pytest.raises(BusConfigConflict, match="ttl"):
        async with Bus.connect(longer):
            pass


async def test_an_existing_consumer_with_other_filters_is_an_error(bus_settings: BusSettings) -> None:
    async with Bus.connect(bus_settings) as bus:
        await bus.js.add_consumer(
            subjects.DESIRED_STREAM.name,
            durable_name=subjects.RUNNER_SET_DESIRED.durable,
            filter_subject="runnerscale.desired.x.>",
        )

        async def never(delivery: Delivery) -> None:
            raise AssertionError("unreachable")

        with pytest.raises(BusConfigConflict, match="filter_subject"):
            await bus.consume(subjects.RUNNER_SET_DESIRED, never)


async def test_unreachable_nats_is_a_clear_startup_error(bus_settings: BusSettings, nats_server: NatsServer) -> None:
    nats_server.stop()
    unreachable = msgspec.structs.replace(bus_settings, connect_timeout=1.0)
    with pytest.raises(BusUnavailable, match="cannot connect to NATS"):
        async with Bus.connect(unreachable):
            pass


async def test_an_error_inside_the_blocks_propagates_as_itself(bus_settings: BusSettings) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with Bus.connect(bus_settings) as bus, ShardOwnership.join(bus, "g", replica_id="r"):
            raise Boom
    with pytest.raises(Boom):
        async with Bus.connect(bus_settings) as bus, LeaderLease.join(bus, "leader.x", replica_id="r"):
            raise Boom


async def test_clustered_replicas_on_a_single_server_are_refused_clearly(bus_settings: BusSettings) -> None:
    three = msgspec.structs.replace(bus_settings, stream_replicas=3)
    with pytest.raises(BusConfigConflict, match=r"(?i)replica"):
        async with Bus.connect(three):
            pass


async def test_a_consumer_with_new_redelivery_bounds_is_updated_in_place(bus_settings: BusSettings) -> None:
    RUNNER_SET_DESIRED = subjects.RUNNER_SET_DESIRED
    async with Bus.connect(bus_settings) as bus:
        old = msgspec.structs.replace(RUNNER_SET_DESIRED, max_deliver=3, ack_wait_seconds=10.0)
        new = msgspec.structs.replace(RUNNER_SET_DESIRED, max_deliver=7, ack_wait_seconds=20.0)
        for spec in (old, new):
            await bus._ensure_consumer(spec.stream, consumer_config(spec, spec.durable, inactive_threshold=None))
        info = await bus.js.consumer_info(RUNNER_SET_DESIRED.stream, RUNNER_SET_DESIRED.durable)
        assert info.config.max_deliver == 8  # ours + 1: we terminate at 7 ourselves
        assert info.config.ack_wait == pytest.approx(20.0)
