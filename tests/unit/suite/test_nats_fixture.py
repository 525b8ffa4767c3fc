import nats
import pytest

from tests.fixtures.nats import NatsServer

pytestmark = pytest.mark.anyio


async def test_nats_server_fixture_serves_jetstream(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url, connect_timeout=5)
    try:
        js = nc.jetstream()
        await js.add_stream(name="PROBE", subjects=["probe.>"])
        ack = await js.publish("probe.x", b"1")
        assert ack.seq == 1
    finally:
        await nc.close()
