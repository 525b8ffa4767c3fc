"""Listener pods connect to NATS as the listener's own user (README "Authentication and
permissions"): the listener-pod worker reads that user's password from a file and writes it into
the listener config Secret, never into the pod spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.listener_pod import build, decide
from shared.bus import BusSettings
from shared.listener_config import parse_config
from shared.settings import InvalidSetting
from tests.unit.services.listener_pod.test_desired import PAT, make_al

OWN = build.BusPassThrough.from_bus_settings(
    BusSettings(nats_urls=("nats://nats:4222",), user="listener-pod", password="worker-password-1")
)


def _settings(tmp_path: Path, password: str = "listener-password-1\n") -> decide.ListenerPodSettings:
    path = tmp_path / "listener.password"
    path.write_text(password)
    return decide.ListenerPodSettings(nats_user="listener", nats_password_file=str(path))


def test_the_listener_config_carries_the_listeners_own_user_not_the_workers(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    bus = build.listener_bus(OWN, settings)
    cfg = build.listener_config(make_al(), PAT, settings, bus)
    assert (cfg["nats"]["user"], cfg["nats"]["password"]) == ("listener", "listener-password-1")
    assert cfg["nats"]["servers"] == ["nats://nats:4222"]
    config = parse_config(build.encode_config(cfg))
    assert (config.nats.user, config.nats.password) == ("listener", "listener-password-1")
    assert "worker-password-1" not in build.encode_config(cfg).decode()
    # The pod only mounts the config Secret: no password in its spec.
    pod = json.dumps(build.desired_listener_pod(make_al(), settings, "1"))
    assert "listener-password-1" not in pod and "worker-password-1" not in pod
    assert "listener-password-1" not in repr(bus)


def test_without_a_listener_user_the_workers_own_credentials_pass_through() -> None:
    bus = build.listener_bus(OWN, decide.ListenerPodSettings())
    assert (bus.user, bus.password) == ("listener-pod", "worker-password-1")


def test_a_listener_user_needs_its_password_file_and_the_file_a_password(tmp_path: Path) -> None:
    with pytest.raises(InvalidSetting, match="listener-nats-password-file"):
        decide.ListenerPodSettings(nats_user="listener").validate()
    with pytest.raises(InvalidSetting, match="is empty"):
        build.listener_bus(OWN, _settings(tmp_path, password="\n"))
    missing = decide.ListenerPodSettings(nats_user="listener", nats_password_file=str(tmp_path / "nope"))
    with pytest.raises(InvalidSetting, match="cannot read"):
        build.listener_bus(OWN, missing)
