"""The flags and environment the manifests give each process are accepted by that process's own
argument parser and settings loader: each worker's real ``main(argv)`` runs with the Deployment's
args and the environment Kubernetes would build (envFrom ConfigMaps, Secret keys, fieldRefs), and
only ``anyio.run`` (the start of the event loop) is replaced to capture what it would run."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest

from tests.deploy.conftest import (
    MANIFESTS,
    NAMESPACE,
    NATS,
    NATS_AUTH_PASSWORDS,
    WORKERS,
    Doc,
    deployment_of,
    find,
    load_docs,
    nats_auth_doc,
)

MAINS = {
    "scale-set": "services.scale_set.worker:main",
    "runner-set": "services.runner_set.worker:main",
    "runner": "services.runner.worker:main",
    "listener-pod": "services.listener_pod.worker:main",
}


def secret_data(secret: dict[str, Any]) -> dict[str, str]:
    """A Secret's values as a pod sees them (``data`` is base64, ``stringData`` plain and wins)."""
    data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    return {**data, **(secret.get("stringData") or {})}


def container_env(
    container: dict[str, Any], pod_name: str, docs: list[Doc] | None = None, namespace: str = NAMESPACE
) -> dict[str, str]:
    """The environment Kubernetes builds for ``container`` from ``docs`` (default: deploy/)."""
    docs = [*load_docs(MANIFESTS, NATS), nats_auth_doc()] if docs is None else docs
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(find(docs, "ConfigMap", source["configMapRef"]["name"]).obj["data"])
        else:
            env.update(secret_data(find(docs, "Secret", source["secretRef"]["name"]).obj))
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[item["name"]] = {"metadata.name": pod_name, "metadata.namespace": namespace}[
                source["fieldRef"]["fieldPath"]
            ]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[item["name"]] = secret_data(find(docs, "Secret", ref["name"]).obj)[ref["key"]]
        else:
            env[item["name"]] = find(docs, "ConfigMap", source["configMapKeyRef"]["name"]).obj["data"][
                source["configMapKeyRef"]["key"]
            ]
    return env


def _main(worker: str) -> Callable[[list[str]], int]:
    module, _, func = MAINS[worker].partition(":")
    main: Callable[[list[str]], int] = getattr(__import__(module, fromlist=[func]), func)
    return main


@pytest.mark.parametrize("worker", WORKERS)
def test_worker_accepts_its_deployment(
    worker: str, captured: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    container = deployment_of(worker)["spec"]["template"]["spec"]["containers"][0]
    pod_name = f"runnerscale-{worker}-7d9f8c6b5-x2k4q"
    for name, value in container_env(container, pod_name).items():
        monkeypatch.setenv(name, value)
    subcommand, *argv = container["args"]
    assert subcommand == worker

    code = _main(worker)(argv)  # argparse errors raise SystemExit(2); settings errors return 2

    assert code == 0, capsys.readouterr().err
    ((_run, name, settings, _setup),) = captured
    assert name == worker
    bus = load_docs(NATS)
    bus_env = find(bus, "ConfigMap", "runnerscale-bus").obj["data"]
    assert settings.replica_id == pod_name
    assert settings.metrics_addr == ":8080" and settings.health_addr == ":8081"
    assert settings.namespaces == ()  # all namespaces
    assert list(settings.bus.nats_urls) == [bus_env["RUNNERSCALE_NATS_URL"]]
    # Each worker connects as its own NATS user (README "Authentication and permissions").
    assert (settings.bus.user, settings.bus.password) == (worker, NATS_AUTH_PASSWORDS[worker])
    assert not settings.bus.token
    assert settings.bus.stream_replicas == int(bus_env["RUNNERSCALE_NATS_STREAM_REPLICAS"])
    assert settings.bus.lease_ttl == float(bus_env["RUNNERSCALE_BUS_LEASE_TTL"])


def test_flags_are_checked(captured: list[tuple[Any, ...]]) -> None:
    """The harness above would notice a flag a worker does not have."""
    with pytest.raises(SystemExit) as exc:
        _main("runner")(["--no-such-flag"])
    assert exc.value.code == 2 and captured == []


def test_listener_pod_passes_the_bus_to_listener_pods(
    captured: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listener pods (runnerscale-system) get the worker's NATS URL and user through their config."""
    from services.listener_pod import build

    container = deployment_of("listener-pod")["spec"]["template"]["spec"]["containers"][0]
    for name, value in container_env(container, "runnerscale-listener-pod-0").items():
        monkeypatch.setenv(name, value)
    assert _main("listener-pod")(container["args"][1:]) == 0
    settings = captured[0][2]
    passthrough = build.BusPassThrough.from_bus_settings(settings.bus)
    assert passthrough.servers == (f"nats://nats.{NAMESPACE}.svc:4222",)
    assert (passthrough.user, passthrough.password) == ("listener-pod", NATS_AUTH_PASSWORDS["listener-pod"])


def test_bus_setup_job_accepts_its_settings(captured: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.bus.cli import main as bus_main

    job = find(load_docs(NATS), "Job", "runnerscale-bus-setup").obj
    container = job["spec"]["template"]["spec"]["containers"][0]
    for name, value in container_env(container, "runnerscale-bus-setup-abcde").items():
        monkeypatch.setenv(name, value)
    assert container["args"][0] == "bus"
    assert bus_main(container["args"][1:]) == 0
    ((_setup, settings),) = captured
    bus_env = find(load_docs(NATS), "ConfigMap", "runnerscale-bus").obj["data"]
    assert settings.stream_replicas == int(bus_env["RUNNERSCALE_NATS_STREAM_REPLICAS"])
    assert (settings.user, settings.password) == ("bus-setup", NATS_AUTH_PASSWORDS["bus-setup"])


def test_listener_pods_agree_with_the_workers_on_streams_and_leases(
    captured: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listener pods only get what the listener-pod worker writes into their config (URL, auth,
    timeouts, lease TTL; their environment has no RUNNERSCALE_* variables). They must agree with
    the workers on where NATS is, how to authenticate and the lease TTL (the lease bucket refuses
    another TTL). Stream sizing may differ: a listener never re-tunes existing streams
    (tests/bus/test_streams.py, tune_existing=False)."""
    import json

    from services.listener_pod import build
    from shared.listener_config import bus_settings, parse_config

    container = deployment_of("listener-pod")["spec"]["template"]["spec"]["containers"][0]
    for name, value in container_env(container, "runnerscale-listener-pod-0").items():
        monkeypatch.setenv(name, value)
    assert _main("listener-pod")(container["args"][1:]) == 0
    worker = captured[0][2].bus
    p = build.BusPassThrough.from_bus_settings(worker)
    config = {
        "configure_url": "https://github.com/octo-org",
        "github_token": "x",
        "runner_scale_set_id": 1,
        "ephemeral_runner_set_namespace": "arc-runners",
        "ephemeral_runner_set_name": "arc-runner-set",
        "nats": {
            "servers": list(p.servers),
            "user": p.user,
            "password": p.password,
            "request_timeout_seconds": p.request_timeout_seconds,
            "publish_deadline_seconds": p.publish_deadline_seconds,
        },
        "ha": {"lease_ttl_seconds": p.lease_ttl_seconds},
    }
    listener = bus_settings(
        parse_config(json.dumps(config)),
        environ={"POD_NAME": "listener-0", "LISTENER_CONFIG_PATH": "/etc/gha-listener/config.json"},
    )
    assert listener.lease_ttl == worker.lease_ttl
    assert listener.nats_urls == worker.nats_urls
    assert (listener.user, listener.password) == (worker.user, worker.password) != ("", "")
