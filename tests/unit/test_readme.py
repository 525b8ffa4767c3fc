"""The README documents what users type and what they inspect: every subcommand, every NATS
stream, durable consumer and KV bucket (with a nats CLI command), and the two make targets."""

import re
from pathlib import Path

from shared.bus import subjects
from shared.cli import SUBCOMMANDS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_first_screen_shows_the_two_commands():
    first_screen = "\n".join(README.splitlines()[:30])
    assert "make demo" in first_screen and "make test" in first_screen


def test_every_subcommand_is_documented():
    missing = [name for name in SUBCOMMANDS if f"runnerscale {name}" not in README and f"`{name}`" not in README]
    assert not missing, missing


def test_every_stream_consumer_and_bucket_is_documented_with_a_nats_command():
    for stream in subjects.STREAMS:
        assert stream.name in README, stream.name
    for consumer in subjects.CONSUMERS:
        assert consumer.durable in README, consumer.durable
    for bucket in subjects.BUCKETS:
        assert bucket in README, bucket
        assert re.search(rf"nats kv \w+ {re.escape(bucket)}", README), f"no nats kv command for {bucket}"
    assert "nats stream view" in README and "nats sub " in README


def test_simulator_control_api_is_documented():
    for path in ("/_sim/jobs", "/_sim/faults", "/_sim/runners", "/_sim/sessions", "/_sim/reset"):
        assert path in README, path
