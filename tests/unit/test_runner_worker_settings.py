"""The runner worker's flags and environment: defaults < env < flags, errors name the flag."""

from __future__ import annotations

import argparse

import pytest

from services.runner.decide import ARC_FAILURE_BACKOFF, RunnerSettings
from services.runner.worker import add_runner_arguments, load_runner_settings, main
from shared.cli import SUBCOMMANDS
from shared.worker import SettingsError, add_worker_arguments


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_worker_arguments(parser)
    add_runner_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_are_arcs():
    settings, prefixes = load_runner_settings(parse(), {})
    assert settings == RunnerSettings()
    assert settings.failure_backoff == ARC_FAILURE_BACKOFF and settings.max_failures == 5
    assert prefixes == ()


def test_env_then_flags():
    env = {
        "RUNNERSCALE_RUNNER_FAILURE_BACKOFF": "0,1,2",
        "RUNNERSCALE_RUNNER_MAX_FAILURES": "3",
        "RUNNERSCALE_RUNNER_POD_START_DEADLINE": "60",
    }
    settings, _ = load_runner_settings(parse("--max-failures", "7", "--exclude-label-propagation-prefix", "a/,b/"), env)
    assert settings.failure_backoff == (0.0, 1.0, 2.0)
    assert settings.max_failures == 7
    assert settings.pod_start_deadline == 60.0
    _, prefixes = load_runner_settings(
        parse("--exclude-label-propagation-prefix", "a/,b/", "--exclude-label-propagation-prefix", "c/"), {}
    )
    assert prefixes == ("a/", "b/", "c/")


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-failures", "x"), ("--pod-start-deadline", "-1"), ("--failure-backoff", "1,a"), ("--failure-backoff", ",")],
)
def test_bad_values_name_the_setting(flag, value):
    with pytest.raises(SettingsError):
        load_runner_settings(parse(flag, value), {})


def test_registered_and_bad_flag_exits_2(capsys):
    assert SUBCOMMANDS["runner"][0] == "services.runner.worker:main"
    assert main(["--max-failures", "nope"]) == 2
    assert "--max-failures" in capsys.readouterr().err
