"""``runnerscale scale-set`` flags: required options, environment fallbacks, exit code 2."""

from __future__ import annotations

import pytest

from services.scale_set.worker import WORKER, ScaleSetSettings, listener_owner_keys, main
from shared import settings as loader
from shared.api import AutoscalingListener, AutoscalingListenerSpec
from shared.kube import ObjectKey
from shared.settings import SettingsError


def load(*argv: str, environ: dict[str, str]) -> ScaleSetSettings:
    return loader.load(ScaleSetSettings, WORKER.parser().parse_args(list(argv)), environ)


def test_flags_build_options() -> None:
    opts = load(
        "--controller-namespace",
        "arc-systems",
        "--listener-image",
        "img:1",
        "--listener-image-pull-secret",
        "a,b",
        "--listener-image-pull-secret",
        "a",
        "--exclude-label-propagation-prefix",
        "helm.sh/",
        environ={},
    ).build
    assert (opts.controller_namespace, opts.listener_image) == ("arc-systems", "img:1")
    assert opts.image_pull_secrets == ("a", "b")
    assert opts.exclude_label_prefixes == ("helm.sh/",)


def test_environment_fallbacks_use_arcs_names_too() -> None:
    opts = load(environ={"CONTROLLER_MANAGER_POD_NAMESPACE": "ns", "CONTROLLER_MANAGER_CONTAINER_IMAGE": "img"})
    assert (opts.controller_namespace, opts.listener_image) == ("ns", "img")
    opts = load(
        "--listener-image",
        "flag",
        environ={"RUNNERSCALE_CONTROLLER_NAMESPACE": "rs", "RUNNERSCALE_LISTENER_IMAGE": "env"},
    )
    assert (opts.controller_namespace, opts.listener_image) == ("rs", "flag")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ((), "--controller-namespace"),
        (("--controller-namespace", "ns"), "--listener-image"),
        (("--listener-image", "img"), "--controller-namespace"),
        (
            ("--controller-namespace", "ns", "--listener-image", "img", "--scale-set-verify-interval", "0"),
            "--scale-set-verify-interval",
        ),
    ],
)
def test_missing_or_bad_options_are_errors(argv: tuple[str, ...], named: str) -> None:
    with pytest.raises(SettingsError) as err:
        load(*argv, environ={})
    assert err.value.setting.endswith(named)


def test_main_exits_2_on_bad_options(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in (
        "RUNNERSCALE_CONTROLLER_NAMESPACE",
        "CONTROLLER_MANAGER_POD_NAMESPACE",
        "RUNNERSCALE_LISTENER_IMAGE",
        "CONTROLLER_MANAGER_CONTAINER_IMAGE",
    ):
        monkeypatch.delenv(name, raising=False)
    assert main(["--listener-image", "img"]) == 2
    assert "--controller-namespace" in capsys.readouterr().err


def test_listener_events_map_to_their_scale_set() -> None:
    al = AutoscalingListener(
        spec=AutoscalingListenerSpec(autoscaling_runner_set_namespace="ns", autoscaling_runner_set_name="set")
    )
    assert listener_owner_keys(al) == [ObjectKey("ns", "set")]
    assert listener_owner_keys(AutoscalingListener()) == []
