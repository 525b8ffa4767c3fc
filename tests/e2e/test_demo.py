"""End to end: the embedded default, every process separate, a workload scaling up and down.

This runs `runnerscale demo` exactly as `make demo` does (smaller waves, shorter jobs): nats-server,
the API emulator, the Actions simulator, the node simulator and the four workers as separate
processes, the listener as a real process started by the node simulator from the listener pod.
On the real server (``kube_api`` = ``real``) the demo runs with ``--kubeconfig`` against it
instead of starting its own emulator, in namespaces of its own, and must clean up after itself.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.apiserver import KubeApi

pytestmark = pytest.mark.slow


def _run_demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shared.cli", "demo", "--workdir", str(tmp_path / "demo"), *args],
        capture_output=True,
        text=True,
        timeout=420,  # the workload (--timeout) plus start-up and, on a real cluster, clean-up
        check=False,
    )


def test_demo_scales_up_for_jobs_and_back_down_to_min_runners(tmp_path: Path, kube_api: KubeApi) -> None:
    target: list[str] = []
    if not kube_api.is_emulator:
        suffix = secrets.token_hex(3)
        target = ["--kubeconfig", str(kube_api.kubeconfig), "--namespace", f"e2e-{suffix}"]
        target += ["--controller-namespace", f"e2e-{suffix}-systems"]
    done = _run_demo(
        tmp_path,
        *("--waves", "3,1", "--job-seconds", "2", "--min-runners", "1", "--max-runners", "4", "--timeout", "150"),
        *target,
    )
    out = done.stdout
    assert done.returncode == 0, (
        f"demo failed\n--- stdout\n{out}\n--- stderr\n{done.stderr[-4000:]}\n--- children\n{_children_log(tmp_path)}"
    )
    assert "ok: listener session open" in out
    assert (
        "ok: scaled up (>= 4 runner(s) for wave 1)" in out or "ok: scaled up (>= 4 runner(s) for wave 1) or done" in out
    )
    assert "ok: scaled back down to minRunners=1" in out
    assert "demo finished: 4 job(s) ran on ephemeral runners" in out
    # The listener's desired state was seen on the bus, and it reached min+jobs capped at max.
    desired = [int(m) for m in re.findall(r"desired=(\d+) patchId=", out)]
    assert desired and max(desired) == 4 and desired[-1] == 1
    # The closing summary: 4 jobs, both latencies sampled for every job, writes per runner.
    assert "summary: 4 job(s) run on " in out
    assert re.search(r"job queued -> runner Running: +p50 [\d.]+s  p99 [\d.]+s  \(n=4\)", out), out
    assert re.search(r"job finished -> runner removed: p50 [\d.]+s  p99 [\d.]+s  \(n=4\)", out), out
    if target:
        assert "API writes per runner: n/a" in out
    else:
        per_runner = re.search(r"API writes per runner: ([\d.]+) \(", out)
        assert per_runner and 0 < float(per_runner.group(1)) < 100, out
    # The bus was authenticated: one NATS user per component, the config readable by its owner only.
    nats_conf = tmp_path / "demo" / "nats.conf"
    assert nats_conf.stat().st_mode & 0o077 == 0
    assert all(f'user: "{c}"' in nats_conf.read_text() for c in ("listener", "runner-set", "scale-set", "runner"))
    # The listener ran as its own user (the listener-pod worker's user may not publish desired
    # states, so the desired= lines above came from it), its password handed over in a 0600 file.
    assert (tmp_path / "demo" / "nats-listener.password").stat().st_mode & 0o077 == 0
    if target:
        assert "ok: the workers removed the scale set and everything it owned" in out
        assert "ok: cleaned up the cluster" in out


def test_demo_rejects_bad_arguments_without_starting_anything(tmp_path: Path) -> None:
    done = _run_demo(tmp_path, "--waves", "x")
    assert done.returncode == 2
    assert "--waves" in done.stderr
    assert not (tmp_path / "demo").exists()


def _children_log(tmp_path: Path) -> str:
    log = tmp_path / "demo" / "children.log"
    return log.read_text()[-8000:] if log.exists() else "(no children.log)"
