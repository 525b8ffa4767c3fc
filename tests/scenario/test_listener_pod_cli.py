"""``runnerscale listener-pod`` as a real process: flags wire up, it reconciles, SIGTERM exits 0."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.scenario.conftest import Kube, wait_for
from tests.scenario.test_listener_pod_worker import config_of, live_pod, setup_objects

pytestmark = pytest.mark.anyio


async def test_process_reconciles_and_stops_cleanly_on_sigterm(
    kube: Kube, namespace: str, kube_api: Any, nats_server: Any, tmp_path: Path
) -> None:
    await setup_objects(kube, namespace)
    # kube_api.url is plain HTTP on both servers (a kubectl proxy in front of a real one).
    argv = [
        sys.executable, "-m", "shared.cli", "listener-pod",
        "--kube-url", kube_api.url, "--nats-url", nats_server.url, "--bus-lease-ttl", "3",
        "--watch-namespace", namespace, "--lease-namespace", namespace, "--replica-id", "cli-test",
        "--metrics-addr", "127.0.0.1:0", "--health-addr", "127.0.0.1:0",
        "--listener-image", "example.com/runnerscale:cli", "--listener-metrics-addr", "0", "--listener-health-addr", "127.0.0.1:0",
        "--no-node-sim-exec", "--resync-period", "5", "--log-level", "debug",
    ]  # fmt: skip
    errors = tmp_path / "stderr.log"
    with errors.open("wb") as sink:
        proc = await anyio.open_process(argv, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        pod = await wait_for(lambda: live_pod(kube, namespace), timeout=30, what="listener pod created by the process")
        assert pod.spec["containers"][0]["image"] == "example.com/runnerscale:cli"
        assert "runnerscale.dev/node-sim-exec" not in pod.metadata.annotations
        assert "ports" not in pod.spec["containers"][0] and "livenessProbe" not in pod.spec["containers"][0]
        cfg = await config_of(kube, namespace)
        assert cfg.metrics_addr == "" and cfg.nats.servers == [nats_server.url] and cfg.ha.lease_ttl_seconds == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(20):
            await proc.wait()
    stderr = errors.read_text()
    assert proc.returncode == 0, stderr[-2000:]
    assert "ghp_first_token_value" not in stderr, "no secret in the logs"
