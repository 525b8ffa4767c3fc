"""`runnerscale node-sim` as a process: flags, control endpoint, clean SIGTERM exit."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import anyio
import pytest

from services.embedded.node_sim.kube import KubeRest
from tests.fixtures.apiserver import KubeApi

from .helpers import create, phase, pod_body, wait_pod, wait_until

pytestmark = pytest.mark.anyio


async def test_cli_runs_pods_and_stops_on_sigterm(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    argv = [
        sys.executable, "-m", "shared.cli", "node-sim",
        "--kubeconfig", str(kube_api.kubeconfig), "--namespace", namespace, "--node-name", "cli-node",
        "--control-port", "0", "--state-dir", str(tmp_path / "state"), "--log-level", "warning",
    ]  # fmt: skip
    proc = await anyio.open_process(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        with anyio.fail_after(15):
            line = (await proc.stdout.receive()).decode()
        assert line.startswith("control http://127.0.0.1:")
        base = line.split()[1]

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:

            async def synced() -> bool:
                async with http.get(base + "/healthz") as resp:
                    return bool((await resp.json())["synced"])

            await wait_until(synced, what="node sim synced")
        await create(kube, namespace, "pods", pod_body("p", containers=[{"name": "c", "image": "busybox"}]))
        pod = await wait_pod(kube, namespace, "p", lambda p: phase(p) == "Running", what="Running")
        assert pod["spec"]["nodeName"] == "cli-node"

        proc.send_signal(signal.SIGTERM)
        with anyio.fail_after(10):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.aclose()


def test_cli_defers_full_garbage_collections(tmp_path: Path) -> None:
    """Issue 10: a full collection walks every pod the node holds; the process makes collections
    rare (shared THRESHOLDS) and freezes what its set-up imported out of them, only the process: a node
    sim run in-process leaves the host's settings alone."""
    from services.embedded.gc_tuning import THRESHOLDS as GC_THRESHOLDS

    missing = tmp_path / "no-kubeconfig"
    probe = (
        "import gc\n"
        "from services.embedded.node_sim.__main__ import main\n"
        "print(gc.get_threshold(), gc.get_freeze_count(), flush=True)\n"
        "try:\n"
        f"    main(['--kubeconfig', {str(missing)!r}, '--log-level', 'error'])\n"
        "finally:\n"
        "    print(gc.get_threshold(), flush=True)\n"
        "    print(gc.get_freeze_count(), flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    lines = out.stdout.strip().splitlines()
    assert lines[0] == f"{gc.get_threshold()} 0"  # importing changes nothing
    assert lines[-2] == str(GC_THRESHOLDS)
    assert int(lines[-1]) > 10_000  # the modules, classes and functions of its set-up are frozen
    assert GC_THRESHOLDS[0] > 700  # young collections rarer than CPython's default
    assert GC_THRESHOLDS[2] > 10  # full collections deferred beyond CPython's default
