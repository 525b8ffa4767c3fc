"""Credentials reach nats-server (user/password, token); bad ones fail clearly without leaking them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared.bus import Bus, BusSettings, BusUnavailable
from tests.fixtures.nats import NatsServer, _free_port

pytestmark = pytest.mark.anyio

PASSWORD = "s3cret-pa55word"
TOKEN = "t0ken-abcdef-123"


def _serve(args: list[str], tmp_path: Path) -> Iterator[str]:
    server = NatsServer(port=_free_port(), store_dir=tmp_path / "js", extra_args=args)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def password_server(tmp_path: Path) -> Iterator[str]:
    yield from _serve(["--user", "runnerscale", "--pass", PASSWORD], tmp_path)


@pytest.fixture
def token_server(tmp_path: Path) -> Iterator[str]:
    yield from _serve(["--auth", TOKEN], tmp_path)


def _settings(url: str, **kw: Any) -> BusSettings:
    return msgspec.structs.replace(BusSettings(nats_urls=(url,), connect_timeout=1.5, reconnect_wait=0.2), **kw)


async def test_user_and_password_connect(password_server: str) -> None:
    async with Bus.connect(_settings(password_server, user="runnerscale", password=PASSWORD)) as bus:
        assert bus.connected


async def test_a_wrong_password_is_a_clear_error_without_the_password(password_server: str) -> None:
    with pytest.raises(BusUnavailable, match="cannot connect to NATS") as err:
        async with Bus.connect(_settings(password_server, user="runnerscale", password="wrong-password-xyz")):
            pass
    assert "wrong-password-xyz" not in str(err.value)


async def test_token_connects(token_server: str) -> None:
    async with Bus.connect(_settings(token_server, token=TOKEN)) as bus:
        assert bus.connected


async def test_missing_token_is_refused(token_server: str) -> None:
    with pytest.raises(BusUnavailable):
        async with Bus.connect(_settings(token_server)):
            pass
