"""The listener config file: valid documents decode, every invalid one names its field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.listener.__main__ import main
from shared.http import listen_enabled, parse_listen_addr
from shared.listener_config import MAX_INT32, ConfigError, bus_settings, parse_config

VALID = {
    "configure_url": "https://github.com/my-org",
    "github_token": "ghp_exampletoken123",
    "runner_scale_set_id": 7,
    "runner_scale_set_name": "arc-runners",
    "ephemeral_runner_set_namespace": "arc-runners",
    "ephemeral_runner_set_name": "arc-runners",
    "min_runners": 1,
    "max_runners": 5,
}


PEM = "-----BEGIN RSA PRIVATE KEY-----\nMIIEexample\n-----END RSA PRIVATE KEY-----\n"


def doc(**changes: object) -> bytes:
    d = {**VALID, **changes}
    return json.dumps({k: v for k, v in d.items() if v is not None}).encode()


def test_valid_config_decodes_with_defaults() -> None:
    cfg = parse_config(doc())
    assert (cfg.min_runners, cfg.max_runners, cfg.runner_scale_set_id) == (1, 5, 7)
    bus = bus_settings(cfg, environ={})
    assert bus.nats_urls == ("nats://127.0.0.1:4222",)
    # The documented takeover bound: lease TTL + one renew interval, at most 15 s by default.
    assert bus.lease_ttl + bus.effective_renew_interval <= 15


def test_config_file_overrides_the_bus_environment() -> None:
    cfg = parse_config(doc(nats={"servers": ["nats://nats-a:4222", "nats://nats-b:4222"]}, ha={"lease_ttl_seconds": 4}))
    bus = bus_settings(cfg, environ={"RUNNERSCALE_NATS_URL": "nats://env:4222", "RUNNERSCALE_BUS_LEASE_TTL": "30"})
    assert bus.nats_urls == ("nats://nats-a:4222", "nats://nats-b:4222") and bus.lease_ttl == 4
    assert not cfg.uses_github_app


def test_absent_max_runners_is_unbounded_like_arc() -> None:
    cfg = parse_config(doc(max_runners=None))
    assert cfg.max_runners == MAX_INT32


def test_github_app_credentials_are_accepted() -> None:
    cfg = parse_config(
        doc(github_token=None, github_app_id="Iv1.abc", github_app_installation_id=42, github_app_private_key=PEM)
    )
    assert cfg.uses_github_app and cfg.app_id == "Iv1.abc"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"configure_url": ""}, "configure_url"),
        ({"configure_url": "github.com/org"}, "configure_url"),
        ({"configure_url": "https://github.com/a/b/c"}, "configure_url"),
        (
            {"github_token": None, "github_app_id": 5, "github_app_installation_id": 1, "github_app_private_key": "x"},
            "github_app_private_key",
        ),
        ({"runner_scale_set_id": 0}, "runner_scale_set_id"),
        ({"runner_scale_set_id": "7"}, "runner_scale_set_id"),
        ({"ephemeral_runner_set_name": ""}, "ephemeral_runner_set_name"),
        ({"ephemeral_runner_set_namespace": None}, "ephemeral_runner_set_namespace"),
        ({"min_runners": 6}, "min_runners"),
        ({"min_runners": -1}, "min_runners"),
        ({"max_runners": 2**31}, "max_runners"),
        ({"github_token": None}, "github_token"),
        ({"github_app_id": 5}, "github_token"),
        ({"github_token": None, "github_app_id": 5, "github_app_installation_id": 1}, "github_app_private_key"),
        ({"log_level": "loud"}, "log_level"),
        ({"nats": {"servers": ["http://nats:4222"]}}, "nats.servers"),
        ({"nats": {"servers": "nats://x:4222"}}, "nats.servers"),
        ({"nats": {"request_timeout_seconds": 0}}, "nats.request_timeout_seconds"),
        ({"ha": {"lease_ttl_seconds": 3, "renew_interval_seconds": 2}}, "ha.renew_interval_seconds"),
        ({"metrics_addr": "localhost"}, "metrics_addr"),
        ({"max_runnres": 3}, "max_runnres"),
    ],
)
def test_invalid_field_is_named(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc(**changes))
    assert str(info.value).startswith(field), str(info.value)


def test_not_json_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_config(b"{nope")


def test_error_never_echoes_the_token() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc(github_app_id=5))
    assert "ghp_exampletoken123" not in str(info.value)


@pytest.mark.parametrize(
    ("addr", "want"), [(":8080", ("0.0.0.0", 8080)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9", ("::1", 9))]
)
def test_listen_addr(addr: str, want: tuple[str, int]) -> None:
    assert parse_listen_addr(addr) == want


@pytest.mark.parametrize(
    ("metrics_addr", "health_addr", "enabled"),
    [
        ("0", "0", (False, False)),  # ARC's "0" disables
        ("", "", (False, False)),
        (" 0 ", "127.0.0.1:0", (False, True)),  # port 0: a free port chosen at start
        (":0", "", (True, False)),
        ("127.0.0.1:9100", "[::1]:9101", (True, True)),
    ],
)
def test_listen_addresses_accept_port_zero_and_zero_or_empty_to_disable(
    metrics_addr: str, health_addr: str, enabled: tuple[bool, bool]
) -> None:
    cfg = parse_config(doc(metrics_addr=metrics_addr, health_addr=health_addr))
    assert (listen_enabled(cfg.metrics_addr), listen_enabled(cfg.health_addr)) == enabled


def test_defaults_stay_arc_ports() -> None:
    cfg = parse_config(doc())
    assert (cfg.metrics_addr, cfg.health_addr) == (":8080", ":8081")


def test_cli_invalid_file_exits_nonzero_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(doc(min_runners=9))
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "min_runners" in err[0] and "Traceback" not in err[0]


def test_cli_missing_file_exits_nonzero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(tmp_path / "absent.json")]) == 2
    assert "cannot read config file" in capsys.readouterr().err
