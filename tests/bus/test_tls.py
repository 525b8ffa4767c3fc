"""TLS to a real nats-server (issue 5): the bus settings' TLS options (``tls_ca``, ``tls_cert``,
``tls_key``) against a server started with ``--tls`` (and ``--tlsverify`` for client
certificates), with a throw-away CA made for the test. Wrong or missing trust is a clear
``BusUnavailable``, never a traceback or a silent plain-text connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from shared.bus import Bus, BusSettings, BusUnavailable, DesiredState, ResourceRef, load_settings, subjects
from tests.bus.secure_nats import SecureNatsServer, TlsFiles, make_tls_files, tls_args
from tests.fixtures.nats import _free_port

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("nats-tls"))


def _serve(tmp_path: Path, args: list[str]) -> Iterator[SecureNatsServer]:
    server = SecureNatsServer(port=_free_port(), store_dir=tmp_path / "js", extra_args=args, tls=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tls_server(tmp_path: Path, tls_files: TlsFiles) -> Iterator[SecureNatsServer]:
    yield from _serve(tmp_path, tls_args(tls_files))


@pytest.fixture
def mtls_server(tmp_path: Path, tls_files: TlsFiles) -> Iterator[SecureNatsServer]:
    yield from _serve(tmp_path, tls_args(tls_files, verify_clients=True))


def _settings(url: str, **kw: object) -> BusSettings:
    return msgspec.structs.replace(
        BusSettings(
            nats_urls=(url,), connect_timeout=1.5, reconnect_wait=0.2, request_timeout=2.0, publish_deadline=5.0
        ),
        **kw,
    )


async def _round_trip(bus: Bus) -> None:
    """Streams were set up over TLS; a publish is acknowledged and reads back."""
    sent = DesiredState(scale_set_id=3, ers=ResourceRef("ci", "tls.set"), patch_id=5, replicas=2, listener_epoch=1)
    ack = await bus.publish(sent)
    assert ack.stream == subjects.DESIRED_STREAM.name and not ack.duplicate
    got = await bus.last_message(subjects.desired_subject("ci", "tls.set"))
    assert isinstance(got, DesiredState) and (got.patch_id, got.replicas) == (5, 2)


async def test_server_tls_with_the_ca_from_the_settings(tls_server: SecureNatsServer, tls_files: TlsFiles) -> None:
    # From the environment, as a worker reads it (RUNNERSCALE_NATS_TLS_CA).
    settings = load_settings(
        None,
        {
            "RUNNERSCALE_NATS_URL": tls_server.url,
            "RUNNERSCALE_NATS_TLS_CA": str(tls_files.ca),
            "RUNNERSCALE_NATS_CONNECT_TIMEOUT": "3",
        },
    )
    async with Bus.connect(settings, name="tls-test") as bus:
        assert bus.connected
        await _round_trip(bus)


async def test_a_nats_url_with_a_ca_still_upgrades_to_tls(tls_server: SecureNatsServer, tls_files: TlsFiles) -> None:
    """``nats://`` plus a CA: the client follows the server's TLS requirement and verifies it."""
    url = tls_server.url.replace("tls://", "nats://")
    async with Bus.connect(_settings(url, tls_ca=str(tls_files.ca))) as bus:
        await _round_trip(bus)


@pytest.mark.parametrize("trust", ["system roots", "another CA"])
async def test_an_untrusted_server_certificate_is_a_clear_error(
    tls_server: SecureNatsServer, tls_files: TlsFiles, trust: str
) -> None:
    ca = "" if trust == "system roots" else str(tls_files.other_ca)
    with pytest.raises(BusUnavailable) as err:
        async with Bus.connect(_settings(tls_server.url, tls_ca=ca)):
            pass
    text = str(err.value)
    assert text.startswith(f"cannot connect to NATS at {tls_server.url} within 1.5s")
    assert "SSL" in text or "Certificate" in text, text  # names the TLS failure
    assert "\n" not in text


async def test_mutual_tls_with_the_client_certificate(mtls_server: SecureNatsServer, tls_files: TlsFiles) -> None:
    settings = _settings(
        mtls_server.url,
        tls_ca=str(tls_files.ca),
        tls_cert=str(tls_files.client_cert),
        tls_key=str(tls_files.client_key),
    )
    async with Bus.connect(settings) as bus:
        await _round_trip(bus)


async def test_mutual_tls_without_a_client_certificate_is_refused(
    mtls_server: SecureNatsServer, tls_files: TlsFiles
) -> None:
    with pytest.raises(BusUnavailable, match="cannot connect to NATS"):
        async with Bus.connect(_settings(mtls_server.url, tls_ca=str(tls_files.ca))):
            pass
