"""/metrics checked against the simulator's state; /healthz and /readyz; the CLI process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import anyio
import prometheus_client.metrics
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.embedded.actions_sim.runner_agent import run_runner
from shared.actions import ActionsClient, PersonalAccessToken
from shared.listener_config import ListenerConfig
from tests.fixtures.actions_sim import ActionsSim
from tests.listener.conftest import NAMESPACE, BusTap, ScaleSet, start_listener, wait_until

pytestmark = pytest.mark.anyio

GAUGE_OF_STATISTIC = {
    "gha_assigned_jobs": "total_assigned_jobs",
    "gha_running_jobs": "total_running_jobs",
    "gha_registered_runners": "total_registered_runners",
    "gha_busy_runners": "total_busy_runners",
    "gha_idle_runners": "total_idle_runners",
    "gha_available_jobs": "total_available_jobs",
    "gha_acquired_jobs": "total_acquired_jobs",
}


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        return resp.status, await resp.text()


async def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = await get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    # ARC exports no *_created series; users' dashboards expect ARC's series only.
    created = sorted(
        {
            line.split("{")[0].split(" ")[0]
            for line in text.splitlines()
            if "_created" in line.split("{")[0].split(" ")[0]
        }
    )
    assert created == [], f"/metrics exports _created series: {created}"
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], metric: str, /, **labels: str) -> float | None:
    return samples.get((metric, tuple(sorted(labels.items()))))


async def test_metrics_match_the_simulator(
    actions_sim: ActionsSim, scale_set: ScaleSet, make_config: Callable[..., ListenerConfig], bus_tap: BusTap
) -> None:
    # The listener itself must turn the _created series off (prometheus_client exports them by
    # default, and an earlier test of this process may have changed the global switch).
    prometheus_client.metrics.enable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
    cfg = make_config(min_runners=1, max_runners=5)
    scale_set_labels = {
        "name": scale_set.name,
        "namespace": NAMESPACE,
        "repository": "",
        "organization": actions_sim.org,
        "enterprise": "",
    }
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, cfg, "listener-0")
        port = listener.ports["metrics"]
        async with ActionsClient.from_config(actions_sim.config_url(), PersonalAccessToken(actions_sim.pat)) as client:
            quick = await client.generate_jit_config(scale_set.id, "arc-runners-quick")
            slow = await client.generate_jit_config(scale_set.id, "arc-runners-slow")
        await actions_sim.control.enqueue_jobs(count=1, labels=[scale_set.name], duration=0.1, display_name="quick")
        assert (await run_runner(None, quick.encoded_jit_config, job_wait=10)).exit_code == 0
        await actions_sim.control.enqueue_jobs(
            count=1, labels=[scale_set.name], duration=60, display_name="slow", event_name="push"
        )
        tg.start_soon(run_runner, None, slow.encoded_jit_config)

        async def settled() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            stats = (await actions_sim.control.scale_sets())[0].statistics
            samples = await scrape(port)
            if stats.total_running_jobs != 1:
                return None
            for gauge, stat in GAUGE_OF_STATISTIC.items():
                if value(samples, gauge, **scale_set_labels) != getattr(stats, stat):
                    return None
            return samples

        samples = await wait_until(settled, timeout=20)
        # Every gauge equals the simulator's statistics (checked in settled), and:
        assert value(samples, "gha_assigned_jobs", **scale_set_labels) == 1
        assert value(samples, "gha_busy_runners", **scale_set_labels) == 1
        assert value(samples, "gha_min_runners", **scale_set_labels) == 1
        assert value(samples, "gha_max_runners", **scale_set_labels) == 5
        assert value(samples, "gha_desired_runners", **scale_set_labels) == 2  # min 1 + 1 assigned

        job = {"enterprise": "", "organization": actions_sim.org, "repository": actions_sim.repo}
        quick_job = {**job, "job_name": "quick", "event_name": "workflow_dispatch"}
        slow_job = {**job, "job_name": "slow", "event_name": "push"}
        assert value(samples, "gha_started_jobs_total", **quick_job) == 1
        assert value(samples, "gha_started_jobs_total", **slow_job) == 1
        assert value(samples, "gha_completed_jobs_total", **quick_job, job_result="succeeded") == 1
        assert value(samples, "gha_completed_jobs_total", **slow_job, job_result="succeeded") is None
        assert value(samples, "gha_job_startup_duration_seconds_count", **quick_job) == 1
        assert value(samples, "gha_job_startup_duration_seconds_count", **slow_job) == 1
        assert value(samples, "gha_job_execution_duration_seconds_count", **quick_job, job_result="succeeded") == 1
        assert value(samples, "gha_job_queue_duration_seconds_count", **quick_job) == 1
        assert value(samples, "gha_job_queue_duration_seconds_count", **slow_job) == 1

        health = listener.ports["health"]
        assert await get(f"http://127.0.0.1:{health}/healthz") == (200, "ok")
        assert await get(f"http://127.0.0.1:{health}/readyz") == (200, "ok")
        standby = await start_listener(tg, cfg, "listener-1")
        await wait_until(lambda: standby.health.role.value == "standby")
        assert await get(f"http://127.0.0.1:{standby.ports['health']}/readyz") == (503, "standby")
        assert (await get(f"http://127.0.0.1:{standby.ports['health']}/healthz"))[0] == 200
        standby_samples = await scrape(standby.ports["metrics"])
        assert value(standby_samples, "runnerscale_listener_leader", **scale_set_labels) == 0
        assert value(samples, "runnerscale_listener_leader", **scale_set_labels) == 1
        # the leader's polls are answered: its last-poll time is recent; a standby has never polled
        last_poll = value(samples, "runnerscale_listener_last_poll_timestamp_seconds", **scale_set_labels)
        assert last_poll is not None and abs(time.time() - last_poll) < 60
        assert value(standby_samples, "runnerscale_listener_last_poll_timestamp_seconds", **scale_set_labels) is None
        tg.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("metrics_addr", "health_addr", "served"),
    [
        ("0", "0", {}),  # both disabled: nothing listens
        ("127.0.0.1:0", "0", {"metrics": {"/metrics"}}),
        ("", "127.0.0.1:0", {"health": {"/healthz", "/readyz"}}),
        ("127.0.0.1:0", "127.0.0.1:0", {"health": {"/healthz", "/readyz", "/metrics"}}),  # equal: one server
    ],
)
async def test_listen_addresses_free_ports_and_disabled_servers(
    make_config: Callable[..., ListenerConfig],
    bus_tap: BusTap,
    metrics_addr: str,
    health_addr: str,
    served: dict[str, set[str]],
) -> None:
    """Several listeners on one host (the embedded default): port 0 picks a free port per
    listener, and "0" or empty turns a server off."""
    cfg = make_config(metrics_addr=metrics_addr, health_addr=health_addr)
    async with anyio.create_task_group() as tg:
        first = await start_listener(tg, cfg, "listener-0")
        second = await start_listener(tg, cfg, "listener-1")  # same addresses, same host: no collision
        for listener in (first, second):
            assert set(listener.ports) == (
                set(served) | ({"metrics"} if "/metrics" in served.get("health", ()) else set())
            )
            for name, paths in served.items():
                for path in ("/metrics", "/healthz", "/readyz"):
                    status, _ = await get(f"http://127.0.0.1:{listener.ports[name]}{path}")
                    assert (status != 404) == (path in paths), (name, path, status)
        if served:
            assert first.ports != second.ports
        tg.cancel_scope.cancel()


async def test_cli_runs_and_sigterm_deletes_the_session(
    actions_sim: ActionsSim,
    scale_set: ScaleSet,
    make_config: Callable[..., ListenerConfig],
    bus_tap: BusTap,
    tmp_path: Path,
) -> None:
    cfg = make_config(min_runners=2, max_runners=4)
    import msgspec

    path = tmp_path / "config.json"
    path.write_bytes(msgspec.json.encode(cfg))
    # Popen only forks and execs (no wait on the loop); the exit is awaited in a worker thread below.
    proc = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, "-m", "shared.cli", "listener", "--config", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "POD_NAME": "listener-pod-0"},
    )
    try:
        first = await bus_tap.wait_for(lambda t: t.desired, timeout=30)
        assert (first[0].replicas, first[0].patch_id) == (2, 0)
        sessions = await actions_sim.control.sessions()
        assert [s.owner_name for s in sessions] == ["listener-pod-0"]
        proc.send_signal(signal.SIGTERM)
        await anyio.to_thread.run_sync(lambda: proc.wait(timeout=20))
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode()
        assert proc.returncode == 0, stderr
        assert await actions_sim.control.sessions() == []
        lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        assert any(line["msg"] == "message session deleted" for line in lines)
        assert actions_sim.pat not in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()
