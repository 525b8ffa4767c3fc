"""WorkerSettings: env < flags, validation names the setting; pure helpers of shared.worker."""

from __future__ import annotations

import argparse

import pytest

from shared.api import ProxyConfig, ProxyServerConfig
from shared.bus import DesiredState, JobStarted, ResourceChanged, ResourceRef, RevisionPublished
from shared.http import parse_listen_addr
from shared.kube import ObjectKey
from shared.worker import (
    SettingsError,
    add_worker_arguments,
    default_key_of,
    load_worker_settings,
    proxy_url_for,
)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_worker_arguments(p)
    return p.parse_args(argv)


def test_defaults_env_and_flags() -> None:
    s = load_worker_settings(parse([]), environ={"POD_NAME": "pod-7", "RUNNERSCALE_WATCH_NAMESPACES": "a, b"})
    assert s.replica_id == "pod-7"
    assert s.namespaces == ("a", "b")
    assert s.metrics_addr == ":8080" and s.health_addr == ":8081"
    s = load_worker_settings(
        parse(
            [
                "--watch-namespace",
                "x",
                "--watch-namespace",
                "y,x",
                "--replica-id",
                "r1",
                "--workers",
                "4",
                "--nats-url",
                "nats://n:4222",
            ]
        ),
        environ={"POD_NAME": "pod-7", "RUNNERSCALE_WATCH_NAMESPACES": "a"},
    )
    assert s.namespaces == ("x", "y") and s.replica_id == "r1" and s.workers == 4
    assert s.bus.nats_urls == ("nats://n:4222",)


@pytest.mark.parametrize(
    ("argv", "env_name"),
    [
        (["--workers", "many"], "RUNNERSCALE_WORKERS"),
        (["--workers", "0"], "RUNNERSCALE_WORKERS"),
        (["--metrics-addr", "nonsense"], "RUNNERSCALE_METRICS_ADDR"),
        (["--log-level", "loud"], "RUNNERSCALE_LOG_LEVEL"),
        (["--kube-url", "ftp://x"], "RUNNERSCALE_KUBE_URL"),
        (["--actions-timeout", "-1"], "RUNNERSCALE_ACTIONS_TIMEOUT"),
        (["--nats-url", "http://x"], "RUNNERSCALE_NATS_URL"),
        (["--reconcile-timeout", "0"], "RUNNERSCALE_RECONCILE_TIMEOUT"),
    ],
)
def test_bad_settings_name_the_setting(argv: list[str], env_name: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_worker_settings(parse(argv), environ={})
    assert env_name in str(err.value)


def test_listen_addr() -> None:
    assert parse_listen_addr("0") is None
    assert parse_listen_addr(":8080") == ("0.0.0.0", 8080)
    assert parse_listen_addr("127.0.0.1:0") == ("127.0.0.1", 0)
    with pytest.raises(ValueError):
        parse_listen_addr("8080")


def test_proxy_url_selection() -> None:
    proxy = ProxyConfig(
        http=ProxyServerConfig(url="http://proxy:3128"),
        https=ProxyServerConfig(url="http://sproxy:3129", credential_secret_ref="creds"),
        no_proxy=["internal.example", ".corp"],
    )
    creds = {"creds": ("user", "p@ss")}
    assert proxy_url_for("https://github.com/org", proxy, creds) == "http://user:p%40ss@sproxy:3129"
    assert proxy_url_for("http://ghes.local/org", proxy, creds) == "http://proxy:3128"
    assert proxy_url_for("https://internal.example/org", proxy, creds) is None
    assert proxy_url_for("https://git.corp/org", proxy, creds) is None
    assert proxy_url_for("https://github.com/org", None, {}) is None


def test_default_key_of() -> None:
    ref = ResourceRef("ns", "set")
    assert default_key_of(DesiredState(scale_set_id=1, ers=ref, patch_id=0, replicas=1, listener_epoch=1)) == ObjectKey(
        "ns", "set"
    )
    assert default_key_of(RevisionPublished(ers=ref, revision=2)) == ObjectKey("ns", "set")
    assert default_key_of(ResourceChanged(resource_kind="AutoscalingListener", ref=ref)) == ObjectKey("ns", "set")
    assert default_key_of(JobStarted(scale_set_id=1, scale_set=ref, runner_name="r", runner_id=1)) == ObjectKey(
        "ns", "set"
    )
