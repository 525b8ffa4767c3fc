"""``runnerscale listener-pod`` flags → reconciler options (pure parts of the process wiring)."""

from __future__ import annotations

from datetime import UTC

import pytest

from services.listener_pod.decide import ListenerPodSettings
from services.listener_pod.worker import WORKER, listener_key_from_labels, main
from shared import settings as loader
from shared.api import ObjectMeta
from shared.backoff import Backoff
from shared.kube import ObjectKey
from shared.kube.objects import Role
from shared.settings import SettingsError


def load(*argv: str, env: dict[str, str] | None = None) -> ListenerPodSettings:
    return loader.load(ListenerPodSettings, WORKER.parser().parse_args(list(argv)), env or {})


def test_defaults_follow_arc() -> None:
    s = load()
    assert (s.metrics_addr, s.metrics_endpoint, s.health_addr) == (":8080", "/metrics", ":8081")
    assert s.node_sim_exec is True
    assert s.resync_seconds == 60.0
    assert s.restart == Backoff(base=1.0, cap=60.0)


def test_flags_and_environment() -> None:
    s = load(
        "--listener-image",
        "reg/x:1",
        "--listener-metrics-addr",
        "0",
        "--listener-health-addr",
        "127.0.0.1:9999",
        "--exclude-label-propagation-prefix",
        "a/",
        "--exclude-label-propagation-prefix",
        "b/",
        "--resync-period",
        "5",
        "--listener-restart-backoff",
        "0.5",
        "--no-node-sim-exec",
        "--listener-nats-url",
        "nats://a:4222",
    )
    assert s.image == "reg/x:1" and s.metrics_addr == "0" and s.health_addr == "127.0.0.1:9999"
    assert s.exclude_label_prefixes == ("a/", "b/") and s.node_sim_exec is False
    assert s.resync_seconds == 5.0 and s.restart.base == 0.5
    assert s.nats_urls == ("nats://a:4222",)
    assert load(env={"RUNNERSCALE_LISTENER_IMAGE": "env/img:2"}).image == "env/img:2"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--resync-period", "0"), "--resync-period"),
        (("--listener-health-addr", "nonsense"), "--listener-health-addr"),
        (("--listener-restart-backoff", "-1"), "--listener-restart-backoff"),
    ],
)
def test_bad_flags_are_settings_errors(argv: tuple[str, ...], named: str) -> None:
    with pytest.raises(SettingsError) as err:
        load(*argv)
    assert err.value.setting.endswith(named)


def test_main_exits_2_on_a_bad_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--resync-period", "0", "--kube-url", "http://127.0.0.1:1"]) == 2
    assert "--resync-period" in capsys.readouterr().err


def test_roles_map_back_to_their_listener_by_label() -> None:
    role = Role(
        metadata=ObjectMeta(
            name="l",
            namespace="arc-runners",
            labels={"auto-scaling-listener-namespace": "arc-systems", "auto-scaling-listener-name": "l"},
        )
    )
    assert list(listener_key_from_labels(role)) == [ObjectKey("arc-systems", "l")]
    assert list(listener_key_from_labels(Role(metadata=ObjectMeta(name="x", namespace="n")))) == []


def test_runner_set_changes_wake_listeners_only_when_it_goes() -> None:
    from datetime import datetime

    from services.listener_pod.worker import WhenGone
    from shared.kube import Change, ChangeType

    source = WhenGone(informer=None, map_keys=lambda obj: [ObjectKey("ctl", f"{obj.metadata.name}-listener")])  # type: ignore[arg-type]
    live = Role(metadata=ObjectMeta(name="ars", namespace="n"))
    deleting = Role(metadata=ObjectMeta(name="ars", namespace="n", deletion_timestamp=datetime.now(UTC)))
    key = ObjectKey("n", "ars")
    assert list(source.keys(Change(ChangeType.MODIFIED, key, live))) == [], "status churn does not reconcile listeners"
    assert list(source.keys(Change(ChangeType.MODIFIED, key, deleting))) == [ObjectKey("ctl", "ars-listener")]
    assert list(source.keys(Change(ChangeType.DELETED, key, live))) == [ObjectKey("ctl", "ars-listener")]
