"""The README documents what users type and what they inspect: every subcommand, every NATS
stream, durable consumer and KV bucket (with a nats CLI command), and the two make targets."""

import re

from shared.bus import subjects
from shared.cli import SUBCOMMANDS
from tests.support.paths import REPO

README = (REPO / "README.md").read_text()


def test_first_screen_shows_the_two_commands() -> None:
    first_screen = "\n".join(README.splitlines()[:30])
    assert "make demo" in first_screen and "make test" in first_screen


def test_every_subcommand_is_documented() -> None:
    missing = [name for name in SUBCOMMANDS if f"runnerscale {name}" not in README and f"`{name}`" not in README]
    assert not missing, missing


def test_every_stream_consumer_and_bucket_is_documented_with_a_nats_command() -> None:
    for stream in subjects.STREAMS:
        assert stream.name in README, stream.name
    for consumer in subjects.CONSUMERS:
        assert consumer.durable in README, consumer.durable
    for bucket in subjects.BUCKETS:
        assert bucket in README, bucket
        assert re.search(rf"nats kv \w+ {re.escape(bucket)}", README), f"no nats kv command for {bucket}"
    assert "nats stream view" in README and "nats sub " in README


def test_simulator_control_api_is_documented() -> None:
    for path in ("/_sim/jobs", "/_sim/faults", "/_sim/runners", "/_sim/sessions", "/_sim/reset"):
        assert path in README, path


def test_every_worker_flag_and_environment_variable_is_documented() -> None:
    from services.listener_pod.worker import WORKER as LISTENER_POD
    from services.runner.worker import WORKER as RUNNER
    from services.runner_set.worker import WORKER as RUNNER_SET
    from services.scale_set.worker import WORKER as SCALE_SET
    from shared.settings import options_of
    from shared.worker import WorkerSettings

    missing = []
    for settings in (WorkerSettings, SCALE_SET.settings, RUNNER_SET.settings, RUNNER.settings, LISTENER_POD.settings):
        for option in options_of(settings).values():
            if f"`{option.flag}" not in README:
                missing.append(option.flag)
            missing += [env for env in option.env[:1] if env not in README]
    assert not missing, missing


def test_readme_references_in_code_name_existing_sections() -> None:
    root = REPO
    headings = {m.group(1).strip() for m in re.finditer(r"^#{2,4} (.+)$", README, re.M)}
    broken = []
    for package in ("shared", "services"):
        for path in (root / package).rglob("*.py"):
            for name in re.findall(r'README "([^"]+)"', path.read_text()):
                if name not in headings:
                    broken.append(f"{path.relative_to(root)}: {name}")
    assert not broken, broken


def test_every_reconcile_outcome_is_documented() -> None:
    from shared.kube import Outcome

    for outcome in Outcome:
        assert f"`{outcome.value}`" in README, outcome
