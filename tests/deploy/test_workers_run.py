"""Each worker started as its Deployment starts it: the container's args and the environment
Kubernetes would build (ConfigMaps, Secret, fieldRefs), against the API emulator and a nats-server
with the users and permissions of deploy/nats. Changed, and only these: the listen ports (free local ports instead of
:8080/:8081), the NATS URL (the local server), KUBECONFIG (the emulator; in a pod the in-cluster
config is used) and the paths of mounted Secret files (written to a local directory). The probes' paths answer 200 on the port they name, /metrics serves the worker's
metrics, and SIGTERM stops the process with exit 0 within terminationGracePeriodSeconds."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.bus import permissions
from tests.deploy.conftest import NATS_AUTH_PASSWORDS, RUNNERSCALE, WORKERS, Emulator, deployment_of, nats_auth_doc
from tests.deploy.exported_metrics import PROCESS_COLLECTORS, exported_series
from tests.deploy.test_flags import container_env, secret_data
from tests.fixtures.nats import NatsServer, _free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("nats")
    conf = directory / "nats.conf"
    conf.write_text(permissions.render_authorization(NATS_AUTH_PASSWORDS))
    server = NatsServer(port=_free_port(), store_dir=directory / "js", extra_args=["-c", str(conf)])
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def find_secret(name: str) -> dict[str, object]:
    doc = nats_auth_doc()
    assert doc.name == name, name
    return doc.obj


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


@pytest.mark.parametrize("worker", WORKERS)
def test_worker_runs_as_deployed(worker: str, emulator: Emulator, nats_url: str, tmp_path: Path) -> None:
    pod = deployment_of(worker)["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = container_env(container, f"runnerscale-{worker}-5c8d7f9b6-q7w2e")
    # Redirected to local test servers: one nats-server here, where the deployment has a 3-server
    # cluster, so streams cannot have 3 replicas.
    env.update(
        RUNNERSCALE_NATS_URL=nats_url,
        RUNNERSCALE_NATS_STREAM_REPLICAS="1",
        KUBECONFIG=str(emulator.kubeconfig),
        PATH=os.environ.get("PATH", ""),
        HOME=str(tmp_path),
    )
    # Secret volumes (the listener user's password of the listener-pod worker) become local files.
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        local_dir = tmp_path / "mounts" / mount["name"]
        local_dir.mkdir(parents=True)
        for item in secret["items"]:
            (local_dir / item["path"]).write_text(secret_data(find_secret(secret["secretName"]))[item["key"]])
        env = {k: v.replace(mount["mountPath"], str(local_dir)) for k, v in env.items()}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    local = {name: _free_port() for name in ports}
    args = []
    for arg in container["args"]:
        local_arg = arg
        for name, port in ports.items():
            local_arg = local_arg.replace(f"=:{port}", f"=127.0.0.1:{local[name]}")
        args.append(local_arg)
    assert args != container["args"]

    proc = subprocess.Popen(
        [RUNNERSCALE, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        probe = container["readinessProbe"]["httpGet"]
        ready_url = f"http://127.0.0.1:{local[probe['port']]}{probe['path']}"
        deadline = time.monotonic() + 40
        while (status := _get(ready_url)[0]) != 200:
            assert proc.poll() is None, (
                f"{worker} exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            )
            assert time.monotonic() < deadline, f"{worker} not ready: {ready_url} → {status}"
            time.sleep(0.1)  # polling the readiness endpoint with a deadline, as the kubelet does

        for kind in ("livenessProbe", "startupProbe"):
            probe = container[kind]["httpGet"]
            assert _get(f"http://127.0.0.1:{local[probe['port']]}{probe['path']}")[0] == 200, kind
        status, metrics = _get(f"http://127.0.0.1:{local['metrics']}/metrics")
        assert status == 200
        assert "controller_runtime_max_concurrent_reconciles" in metrics and "runnerscale_bus_connected 1.0" in metrics
        # what the dashboard and alert tests read from the code is what the process serves
        served = {line.split("{")[0].split()[0] for line in metrics.splitlines() if line and not line.startswith("#")}
        unknown = {n for n in served if not n.startswith(PROCESS_COLLECTORS)} - set(exported_series())
        assert not unknown, f"served but not found in the code by tests/deploy/exported_metrics.py: {unknown}"

        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=pod["terminationGracePeriodSeconds"])
        assert code == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()
