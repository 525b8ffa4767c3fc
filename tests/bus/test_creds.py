"""NATS credentials files (``RUNNERSCALE_NATS_CREDS``, issue 5).

A ``.creds`` file holds a user JWT and its NKey seed: it only works against a server in operator
(decentralised JWT) mode, and nats-py needs the optional ``nkeys`` package to sign the server's
nonce with the seed (README "The bus (NATS JetStream)", "Settings"). Without that package the first connect used to die
with a ``ModuleNotFoundError`` traceback; it is now a settings error naming the setting, before
any network traffic. ``nkeys`` is masked here so the test means the same wherever it runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shared.bus import Bus, BusSettings, SettingsError, load_settings
from tests.fixtures.nats import NatsServer

pytestmark = pytest.mark.anyio

CREDS = """-----BEGIN NATS USER JWT-----
eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.c2ln
------END NATS USER JWT------

-----BEGIN USER NKEY SEED-----
SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4
------END USER NKEY SEED------
"""


@pytest.fixture
def creds_file(tmp_path: Path) -> Path:
    path = tmp_path / "worker.creds"
    path.write_text(CREDS)
    path.chmod(0o600)
    return path


@pytest.fixture
def without_nkeys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nkeys", None)  # `import nkeys` raises ImportError


def test_creds_without_the_nkeys_package_is_a_settings_error(creds_file: Path, without_nkeys: None) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(None, {"RUNNERSCALE_NATS_CREDS": str(creds_file)})
    assert str(err.value).startswith("invalid setting RUNNERSCALE_NATS_CREDS / --nats-creds:")
    assert "nkeys" in str(err.value)
    assert "SUAIBDPB" not in str(err.value)  # the seed never reaches an error text


async def test_connect_with_creds_but_no_nkeys_fails_before_connecting(
    creds_file: Path, without_nkeys: None, nats_server: NatsServer
) -> None:
    settings = BusSettings(nats_urls=(nats_server.url,), creds_file=str(creds_file), connect_timeout=1.0)
    with pytest.raises(SettingsError, match=r"RUNNERSCALE_NATS_CREDS.*nkeys"):
        async with Bus.connect(settings):
            pass
