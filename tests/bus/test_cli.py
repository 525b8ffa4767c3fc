"""`runnerscale bus setup|status` against a real nats-server."""

import json

import anyio
import nats
import pytest

from shared.cli import main
from tests.fixtures.nats import NatsServer


def test_setup_then_status(nats_server: NatsServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bus", "setup", "--nats-url", nats_server.url]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert main(["bus", "status", "--nats-url", nats_server.url]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["stream"] for r in rows if "messages" in r} == {
        "RUNNERSCALE_DESIRED",
        "RUNNERSCALE_JOBS",
        "RUNNERSCALE_REVISIONS",
        "RUNNERSCALE_CHANGES",
    }


def test_setup_reports_a_conflict_and_exits_1(nats_server: NatsServer, capsys: pytest.CaptureFixture[str]) -> None:
    async def squat() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            await nc.jetstream().add_stream(name="RUNNERSCALE_JOBS", subjects=["not.ours"])
        finally:
            await nc.close()

    anyio.run(squat)
    assert main(["bus", "setup", "--nats-url", nats_server.url]) == 1
    err = capsys.readouterr().err
    assert "RUNNERSCALE_JOBS" in err and "conflicting" in err


def test_bad_settings_exit_1_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bus", "setup", "--bus-shards", "0"]) == 1
    assert "--bus-shards" in capsys.readouterr().err
