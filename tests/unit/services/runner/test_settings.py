"""The runner worker's flags and environment: defaults < env < flags, errors name the flag."""

from __future__ import annotations

import argparse

import pytest

from services.runner.decide import ARC_FAILURE_BACKOFF, RunnerSettings
from services.runner.worker import WORKER, main
from shared import settings as loader
from shared.cli import SUBCOMMANDS
from shared.settings import SettingsError


def parse(*argv: str) -> argparse.Namespace:
    return WORKER.parser().parse_args(list(argv))


def test_defaults_are_arcs() -> None:
    settings = loader.load(RunnerSettings, parse(), {})
    assert settings == RunnerSettings()
    assert settings.failure_backoff == ARC_FAILURE_BACKOFF and settings.max_failures == 5
    assert settings.exclude_label_prefixes == ()


def test_env_then_flags() -> None:
    env = {
        "RUNNERSCALE_RUNNER_FAILURE_BACKOFF": "0,1,2",
        "RUNNERSCALE_RUNNER_MAX_FAILURES": "3",
        "RUNNERSCALE_RUNNER_POD_START_DEADLINE": "60",
    }
    settings = loader.load(
        RunnerSettings, parse("--max-failures", "7", "--exclude-label-propagation-prefix", "a/,b/"), env
    )
    assert settings.failure_backoff == (0.0, 1.0, 2.0)
    assert settings.max_failures == 7
    assert settings.pod_start_deadline == 60.0
    settings = loader.load(
        RunnerSettings,
        parse("--exclude-label-propagation-prefix", "a/,b/", "--exclude-label-propagation-prefix", "c/"),
        {},
    )
    assert settings.exclude_label_prefixes == ("a/", "b/", "c/")
    from_env = loader.load(RunnerSettings, parse(), {"RUNNERSCALE_EXCLUDE_LABEL_PROPAGATION_PREFIXES": "x/, y/"})
    assert from_env.exclude_label_prefixes == ("x/", "y/")


def test_pending_status_after_defaults_to_15s_from_env_and_flag() -> None:
    assert loader.load(RunnerSettings, parse(), {}).pending_status_after == 15.0
    env = {"RUNNERSCALE_RUNNER_PENDING_STATUS_AFTER": "5"}
    assert loader.load(RunnerSettings, parse(), env).pending_status_after == 5.0
    assert loader.load(RunnerSettings, parse("--pending-status-after", "0"), env).pending_status_after == 0.0


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--max-failures", "x", "RUNNERSCALE_RUNNER_MAX_FAILURES / --max-failures"),
        ("--pod-start-deadline", "-1", "RUNNERSCALE_RUNNER_POD_START_DEADLINE / --pod-start-deadline"),
        ("--pending-status-after", "-1", "RUNNERSCALE_RUNNER_PENDING_STATUS_AFTER / --pending-status-after"),
        ("--failure-backoff", "1,a", "RUNNERSCALE_RUNNER_FAILURE_BACKOFF / --failure-backoff"),
        ("--failure-backoff", ",", "RUNNERSCALE_RUNNER_FAILURE_BACKOFF / --failure-backoff"),
    ],
)
def test_bad_values_name_the_setting(flag: str, value: str, named: str) -> None:
    with pytest.raises(SettingsError) as err:
        loader.load(RunnerSettings, parse(flag, value), {})
    assert err.value.setting == named


def test_registered_and_bad_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert SUBCOMMANDS["runner"][0] == "services.runner.worker:main"
    assert main(["--max-failures", "nope"]) == 2
    assert "--max-failures" in capsys.readouterr().err
