"""Bus settings: environment < flags, validation errors that name the setting, no leaked secrets."""

import argparse

import pytest

from shared.bus.errors import SettingsError
from shared.bus.settings import BusSettings, add_bus_arguments, load_settings, validate


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bus_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_are_valid_and_hand_over_within_15_seconds() -> None:
    s = load_settings(parse([]), environ={})
    assert s.nats_urls == ("nats://127.0.0.1:4222",)
    assert s.lease_ttl + s.effective_renew_interval <= 15
    assert s.effective_renew_interval < s.lease_ttl / 3
    assert s.lease_validity < s.lease_ttl


def test_environment_is_read_and_flags_override_it() -> None:
    env = {
        "RUNNERSCALE_NATS_URL": "nats://a:4222, nats://b:4222",
        "RUNNERSCALE_BUS_SHARDS": "32",
        "RUNNERSCALE_BUS_HISTORY": "5",
    }
    s = load_settings(parse(["--bus-shards", "8"]), environ=env)
    assert s.nats_urls == ("nats://a:4222", "nats://b:4222")
    assert s.shards == 8
    assert s.history == 5


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"RUNNERSCALE_BUS_SHARDS": "many"}, "RUNNERSCALE_BUS_SHARDS / --bus-shards"),
        ({"RUNNERSCALE_BUS_SHARDS": "0"}, "RUNNERSCALE_BUS_SHARDS"),
        ({"RUNNERSCALE_NATS_URL": "http://x"}, "RUNNERSCALE_NATS_URL"),
        ({"RUNNERSCALE_NATS_URL": "nats://x:port"}, "RUNNERSCALE_NATS_URL"),
        ({"RUNNERSCALE_NATS_URL": " , "}, "RUNNERSCALE_NATS_URL"),
        ({"RUNNERSCALE_NATS_USER": "u"}, "RUNNERSCALE_NATS_PASSWORD"),
        (
            {"RUNNERSCALE_NATS_TOKEN": "t0k3n-123", "RUNNERSCALE_NATS_USER": "u", "RUNNERSCALE_NATS_PASSWORD": "p"},
            "RUNNERSCALE_NATS_CREDS",
        ),
        ({"RUNNERSCALE_NATS_CREDS": "/nonexistent/x.creds"}, "RUNNERSCALE_NATS_CREDS"),
        ({"RUNNERSCALE_NATS_TLS_CERT": __file__}, "RUNNERSCALE_NATS_TLS_KEY"),
        ({"RUNNERSCALE_BUS_LEASE_TTL": "0.5"}, "RUNNERSCALE_BUS_LEASE_TTL"),
        ({"RUNNERSCALE_BUS_LEASE_TTL": "3", "RUNNERSCALE_BUS_RENEW_INTERVAL": "1"}, "RUNNERSCALE_BUS_RENEW_INTERVAL"),
        ({"RUNNERSCALE_BUS_HISTORY": "100"}, "RUNNERSCALE_BUS_HISTORY"),
        ({"RUNNERSCALE_NATS_STREAM_REPLICAS": "0"}, "RUNNERSCALE_NATS_STREAM_REPLICAS"),
        (
            {"RUNNERSCALE_BUS_DUPLICATE_WINDOW": "7200", "RUNNERSCALE_BUS_JOB_RETENTION": "60"},
            "RUNNERSCALE_BUS_DUPLICATE_WINDOW",
        ),
        ({"RUNNERSCALE_BUS_OUTBOX_CAPACITY": "0"}, "RUNNERSCALE_BUS_OUTBOX_CAPACITY"),
    ],
)
def test_invalid_settings_name_the_setting(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(parse([]), environ=env)
    assert named in str(err.value)
    assert err.value.setting.startswith(named.split(" ", maxsplit=1)[0])


def test_secrets_never_appear_in_repr_or_errors() -> None:
    s = load_settings(
        parse([]), environ={"RUNNERSCALE_NATS_USER": "bob", "RUNNERSCALE_NATS_PASSWORD": "hunter2-secret"}
    )
    assert "hunter2-secret" not in repr(s)
    assert "bob" in repr(s)
    with pytest.raises(SettingsError) as err:
        load_settings(parse([]), environ={"RUNNERSCALE_NATS_URL": "nats://bob:hunter2-secret@host:bad"})
    assert "hunter2-secret" not in str(err.value)


def test_validate_accepts_a_test_sized_lease() -> None:
    validate(BusSettings(lease_ttl=1.0, renew_interval=0.2))
