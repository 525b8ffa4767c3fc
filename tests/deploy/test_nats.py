"""deploy/nats: the nats-server configuration is valid for the real nats-server, three servers
started from it form a JetStream cluster, and the bus-setup Job's command creates every stream and
bucket on it with the settings of the runnerscale-bus ConfigMap (addresses rewritten to localhost,
nothing else changed)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.bus import permissions, subjects
from tests.deploy.conftest import MANIFESTS, NAMESPACE, NATS, NATS_AUTH_PASSWORDS, RUNNERSCALE, find, load_docs
from tests.deploy.test_flags import container_env
from tests.fixtures.nats import _free_port, nats_server_binary

# What the nats-server containers get from the Secret runnerscale-nats-auth (statefulset.yaml).
SERVER_ENV = {permissions.password_env_var(c): pw for c, pw in NATS_AUTH_PASSWORDS.items()}


def nats_conf() -> str:
    conf: str = find(load_docs(NATS), "ConfigMap", "nats-config").obj["data"]["nats.conf"]
    return conf


def test_config_is_valid_for_nats_server(tmp_path: Path) -> None:
    conf = tmp_path / "nats.conf"
    conf.write_text(nats_conf())
    env = {"PATH": os.environ.get("PATH", ""), "POD_NAME": "nats-0", **SERVER_ENV}
    ok = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(conf)], check=False, capture_output=True, text=True, env=env, timeout=30
    )
    assert ok.returncode == 0, ok.stderr + ok.stdout
    # The passwords really come from the environment (the Secret): without one the config is refused.
    env.pop("NATS_PASSWORD_RUNNER")
    bad = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(conf)], check=False, capture_output=True, text=True, env=env, timeout=30
    )
    assert bad.returncode != 0 and "NATS_PASSWORD_RUNNER" in bad.stderr + bad.stdout


def test_authorization_is_the_permissions_table() -> None:
    """The users and permissions of deploy/nats are shared/bus/permissions.py's table, rendered
    (regenerate with ``permissions.render_authorization`` after changing the table)."""
    refs = {c: f"${permissions.password_env_var(c)}" for c in permissions.COMPONENTS}
    assert permissions.render_authorization(refs) in nats_conf()
    assert "token" not in nats_conf()
    env = find(load_docs(NATS), "StatefulSet", "nats").obj["spec"]["template"]["spec"]["containers"][0]["env"]
    from_secret = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}
    assert from_secret == {
        permissions.password_env_var(c): {"name": "runnerscale-nats-auth", "key": c} for c in permissions.COMPONENTS
    }


def _local_conf(i: int, ports: list[tuple[int, int, int]], tmp: Path) -> str:
    """The deploy config with the three servers' DNS names and ports mapped to localhost."""
    client, http, cluster = ports[i]
    text = nats_conf()
    text = text.replace("listen: 0.0.0.0:4222", f"listen: 127.0.0.1:{client}")
    text = text.replace("http: 0.0.0.0:8222", f"http: 127.0.0.1:{http}")
    text = text.replace("listen: 0.0.0.0:6222", f"listen: 127.0.0.1:{cluster}")
    for j, (_, _, route) in enumerate(ports):
        text = text.replace(
            f"nats://nats-{j}.nats-headless.{NAMESPACE}.svc.cluster.local:6222", f"nats://127.0.0.1:{route}"
        )
    text = text.replace("store_dir: /data", f"store_dir: {tmp / f'data-{i}'}")
    text = text.replace("pid_file: /var/run/nats/nats.pid", f"pid_file: {tmp / f'nats-{i}.pid'}")
    assert "0.0.0.0" not in text and "svc.cluster.local" not in text and "/data\n" not in text
    return text


def _wait_port(port: int, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if proc.poll() is not None:
                raise _ServerExited(f"nats-server on {port} exited at start (exit {proc.poll()})") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"nats-server on {port} did not start") from None
            time.sleep(0.05)  # polling a port with a deadline


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[list[str]]:
    # A free port picked here can be taken by another process before nats-server binds it (the
    # suite runs many servers): a cluster whose server exits at start is retried on fresh ports.
    for attempt in range(3):
        cluster = _started_cluster(tmp_path / f"attempt-{attempt}")
        try:
            urls = cluster.__enter__()
        except _ServerExited:
            continue
        try:
            yield urls
        finally:
            cluster.__exit__(None, None, None)
        return
    raise RuntimeError("the 3-server NATS cluster did not start in 3 attempts")


class _ServerExited(RuntimeError):
    pass


@contextlib.contextmanager
def _started_cluster(tmp_path: Path) -> Iterator[list[str]]:
    tmp_path.mkdir()
    ports = [(_free_port(), _free_port(), _free_port()) for _ in range(3)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(3):
            conf = tmp_path / f"nats-{i}.conf"
            conf.write_text(_local_conf(i, ports, tmp_path))
            env = {"PATH": os.environ.get("PATH", ""), "POD_NAME": f"nats-{i}", **SERVER_ENV}
            procs.append(
                subprocess.Popen(
                    [nats_server_binary(), "-c", str(conf)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + 20
        for (client, _, _), proc in zip(ports, procs, strict=True):
            _wait_port(client, proc, deadline)
        yield [f"nats://127.0.0.1:{client}" for client, _, _ in ports]
    finally:
        for proc in procs:  # stopped by PID, only the processes started here
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _job_env(urls: list[str]) -> dict[str, str]:
    job = find(load_docs(NATS), "Job", "runnerscale-bus-setup").obj
    env = container_env(job["spec"]["template"]["spec"]["containers"][0], "runnerscale-bus-setup-x")
    env["RUNNERSCALE_NATS_URL"] = ",".join(urls)  # the only change: where the servers are
    return {"PATH": os.environ.get("PATH", ""), **env}


@pytest.mark.slow
def test_bus_setup_job_on_the_deployed_nats_cluster(nats_cluster: list[str]) -> None:
    job = find(load_docs(NATS), "Job", "runnerscale-bus-setup").obj
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    env = _job_env(nats_cluster)
    # JetStream needs a meta leader first: the Job retries (restartPolicy OnFailure); so do we,
    # each attempt bounded by RUNNERSCALE_NATS_CONNECT_TIMEOUT.
    deadline = time.monotonic() + 40
    while True:
        result = subprocess.run([RUNNERSCALE, *args], check=False, capture_output=True, text=True, env=env, timeout=60)
        if result.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # retry backoff of a failed attempt (as the Job's restarts), not synchronisation
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["ok"] is True
    assert set(out["streams"]) == {s.name for s in subjects.STREAMS} | {f"KV_{b}" for b in subjects.BUCKETS}

    # Idempotent (an upgrade re-runs the Job), and a wrong password is refused.
    again = subprocess.run([RUNNERSCALE, *args], check=False, capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 0, again.stderr
    wrong = subprocess.run(
        [RUNNERSCALE, *args],
        check=False,
        capture_output=True,
        text=True,
        env={**env, "RUNNERSCALE_NATS_PASSWORD": "not-the-password-1234", "RUNNERSCALE_NATS_CONNECT_TIMEOUT": "2"},
        timeout=60,
    )
    assert (
        wrong.returncode != 0
        and "cannot connect to NATS" in wrong.stderr
        and "not-the-password-1234" not in wrong.stderr
    )


def mounted_secret_key(pod: dict[str, object], container: dict[str, object], path: str) -> tuple[str, str]:
    """(Secret name, key) of the file ``path`` in ``container``, through its mounts and the pod's volumes."""
    mounts = container.get("volumeMounts", [])
    volumes = {v["name"]: v for v in pod.get("volumes", [])}  # type: ignore[attr-defined]
    for mount in mounts:  # type: ignore[attr-defined]
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix) and "secret" in volumes[mount["name"]]:
            secret = volumes[mount["name"]]["secret"]
            item = next(i for i in secret["items"] if i["path"] == path.removeprefix(prefix))
            return secret["secretName"], item["key"]
    raise AssertionError(f"{path} is not in a mounted Secret")


def test_listener_pods_get_the_listener_user_through_the_listener_pod_worker() -> None:
    """The listener-pod worker connects as itself and hands listener pods the listener user's
    password, read from the Secret key ``listener`` mounted as a file (never a literal)."""
    deployment = find(load_docs(MANIFESTS), "Deployment", "runnerscale-listener-pod").obj
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = container_env(container, "runnerscale-listener-pod-0")
    assert env["RUNNERSCALE_NATS_USER"] == "listener-pod"
    assert env["RUNNERSCALE_NATS_PASSWORD"] == NATS_AUTH_PASSWORDS["listener-pod"]
    assert env["RUNNERSCALE_LISTENER_NATS_USER"] == "listener"
    path = env["RUNNERSCALE_LISTENER_NATS_PASSWORD_FILE"]
    assert mounted_secret_key(pod, container, path) == ("runnerscale-nats-auth", "listener")
    assert not any(pw in json.dumps(deployment) for pw in NATS_AUTH_PASSWORDS.values())
