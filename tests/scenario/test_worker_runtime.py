"""The worker runtime end to end: settings → kube + bus + shards → controllers → HTTP → stop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import aiohttp
import anyio
import pytest

from shared.bus import Bus, DesiredState, ResourceRef, subjects
from shared.kube import DONE, SECRETS, Controller, ObjectKey, ReconcileContext, Result
from shared.worker import WorkerContext, WorkerSettings, running_worker
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.apiserver import KubeApi
from tests.fixtures.nats import NatsServer
from tests.scenario.conftest import Kube, wait_for

pytestmark = pytest.mark.anyio


async def test_worker_runs_controllers_serves_http_and_routes_bus(
    worker_settings: Callable[..., WorkerSettings], kube: Kube, bus: Bus, namespace: str
) -> None:
    seen: list[ObjectKey] = []

    def setup(ctx: WorkerContext) -> list[Controller]:
        secrets = ctx.informers(SECRETS)

        async def reconcile(key: ObjectKey, ctx: ReconcileContext) -> Result:
            seen.append(key)
            return DONE

        c = ctx.controller("secrets-test", reconcile, ctx.for_(secrets))
        ctx.route(subjects.RUNNER_SET_DESIRED, c)
        return [c]

    settings = worker_settings("r0", bus={"shards": 1})
    async with running_worker("runtime-test", settings, setup) as w:
        await w.wait_ready()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{w.ports['health']}/readyz") as r:
                assert r.status == 200
            async with http.get(f"http://127.0.0.1:{w.ports['health']}/healthz") as r:
                assert r.status == 200
            async with http.get(f"http://127.0.0.1:{w.ports['metrics']}/metrics") as r:
                text = await r.text()
                assert "controller_runtime_reconcile_total" in text
                # The worker's client counts its requests in the worker's registry (README "Metrics").
                assert 'runnerscale_kube_requests_total{code="200",resource="secrets",verb="list"}' in text
                assert "runnerscale_kube_rate_limiter_wait_seconds_count" in text
        assert w.ctx is not None
        assert w.ctx.kube._api.user_agent.startswith("runnerscale-runtime-test/")  # the worker's name
        await kube.writer.create(SECRETS, {"metadata": {"name": "s1", "namespace": namespace}, "data": {}})
        await wait_for(lambda: ObjectKey(namespace, "s1") in seen, what="informer-driven reconcile")
        await bus.publish(
            DesiredState(
                scale_set_id=1, ers=ResourceRef(namespace, "from-bus"), patch_id=1, replicas=1, listener_epoch=1
            )
        )
        await wait_for(lambda: ObjectKey(namespace, "from-bus") in seen, what="bus-driven reconcile")
    assert w.done and w.failure is None


async def test_kill_keeps_leases_and_peer_takes_over(
    worker_settings: Callable[..., WorkerSettings], namespace: str
) -> None:
    def setup(ctx: WorkerContext) -> list[Controller]:
        return []

    async with running_worker("takeover-test", worker_settings("a", bus={"shards": 2}), setup) as a:
        await a.wait_ready()
        await wait_for(lambda: len(cast(WorkerContext, a.ctx).shards.owned_shards()) == 2, what="a owns all shards")
        async with running_worker("takeover-test", worker_settings("b", bus={"shards": 2}), setup) as b:
            await b.wait_ready()
            a.kill()
            await a.wait_done(10)
            await wait_for(
                lambda: len(cast(WorkerContext, b.ctx).shards.owned_shards()) == 2,
                timeout=15,
                what="b takes over a's shards",
            )


async def test_actions_client_pool_caches_and_rebuilds_on_secret_change(
    kube: Kube, namespace: str, actions_sim: ActionsSim
) -> None:
    import base64

    from shared.api import ConfigMapKeySelector, TLSCertificateSource, TLSConfig
    from shared.worker import ActionsClientPool, ActionsCredentialsUnavailable
    from tests.scenario.conftest import create_secret

    await create_secret(kube, namespace, "gh", {"github_token": actions_sim.pat})
    pool = ActionsClientPool(kube.reader, timeout=10, max_age=0)  # every call reads: the rotation at once
    try:
        c1 = await pool.get(namespace, config_url=actions_sim.config_url(), secret_name="gh")
        assert await pool.get(namespace, config_url=actions_sim.config_url(), secret_name="gh") is c1
        assert await c1.get_scale_set_by_name("nope") is None  # the client works against the simulator
        secret = await kube.reader.get(SECRETS, ObjectKey(namespace, "gh"))
        await kube.writer.patch_merge(
            SECRETS,
            ObjectKey(namespace, "gh"),
            {"data": {"github_token": base64.b64encode(actions_sim.pat.encode()).decode(), "x": "eA=="}},
            resource_version=secret.metadata.resource_version,
        )
        c2 = await pool.get(namespace, config_url=actions_sim.config_url(), secret_name="gh")
        assert c2 is not c1 and pool.builds == 2  # rotated secret → rebuilt client
        with pytest.raises(ActionsCredentialsUnavailable, match="not found"):
            await pool.get(namespace, config_url=actions_sim.config_url(), secret_name="missing")
        await create_secret(
            kube,
            namespace,
            "bad-app",
            {"github_app_id": "1", "github_app_installation_id": "x", "github_app_private_key": "k"},
        )
        with pytest.raises(ActionsCredentialsUnavailable, match="installation"):
            await pool.get(namespace, config_url=actions_sim.config_url(), secret_name="bad-app")
        tls = TLSConfig(
            certificate_from=TLSCertificateSource(
                config_map_key_ref=ConfigMapKeySelector(name="no-such-ca", key="ca.crt")
            )
        )
        with pytest.raises(ActionsCredentialsUnavailable, match="ConfigMap"):
            await pool.get(namespace, config_url=actions_sim.config_url(), secret_name="gh", tls=tls)
    finally:
        await pool.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_cli_process_becomes_ready_and_stops_cleanly_on_sigterm(
    kube_api: KubeApi, nats_server: NatsServer, namespace: str, tmp_path: Path
) -> None:
    import json
    import signal
    import subprocess
    import sys

    health = _free_port()
    log_file = (tmp_path / "worker.log").open("wb")
    # Popen only forks and execs (no wait on the loop); the exit is awaited in a worker thread below.
    proc = subprocess.Popen(  # noqa: ASYNC220
        [
            sys.executable,
            "-m",
            "shared.cli",
            "runner-set",
            "--kubeconfig",
            str(kube_api.kubeconfig),
            "--nats-url",
            nats_server.url,
            "--watch-namespace",
            namespace,
            "--lease-namespace",  # the shard leases go with the test's namespace
            namespace,
            "--metrics-addr",
            "127.0.0.1:0",
            "--health-addr",
            f"127.0.0.1:{health}",
            "--replica-id",
            "cli-0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log_file,
    )
    try:

        async def ready() -> bool:
            assert proc.poll() is None, "worker exited early"
            try:
                async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{health}/readyz") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(ready, timeout=30, interval=0.1, what="/readyz 200")
        proc.send_signal(signal.SIGTERM)
        code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=20))
        assert code == 0
        lines = [
            json.loads(line) for line in (tmp_path / "worker.log").read_text().splitlines() if line.startswith("{")
        ]
        assert any(line.get("msg") == "worker ready" for line in lines)
        assert any(line.get("msg") == "worker stopped" for line in lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        log_file.close()


async def test_bad_flag_exits_2() -> None:
    from services.runner_set.__main__ import main  # type: ignore[attr-defined]  # imported there, not re-exported

    assert main(["--workers", "zero"]) == 2


async def test_body_errors_propagate_unwrapped_and_dead_nats_fails_start(
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    from shared.bus import BusUnavailable

    with pytest.raises(KeyError):
        async with running_worker("exc-test", worker_settings(), lambda ctx: []):
            raise KeyError("boom")
    dead = worker_settings(bus={"nats_urls": (f"nats://127.0.0.1:{_free_port()}",), "connect_timeout": 1.0})
    with pytest.raises(BusUnavailable):
        async with running_worker("dead-nats", dead, lambda ctx: []):
            pass


async def test_readiness_waits_for_every_part_and_a_stop_while_starting_ends_the_start(
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    """An informer that cannot list (a kind the API server does not serve) never says it is up:
    /readyz stays 503 and wait_ready times out; a stop still ends the worker promptly."""
    from shared.kube import Resource
    from shared.kube.objects import ConfigMap

    unserved = Resource("example.invalid", "v1", "nothings", "Nothing", ConfigMap)

    def setup(ctx: WorkerContext) -> list[Controller]:
        c = ctx.controller("never-synced", _done, ctx.for_(ctx.informers(unserved)))
        return [c]

    async with running_worker("unready-test", worker_settings(bus={"shards": 1}), setup) as w:
        with pytest.raises(TimeoutError):
            await w.wait_ready(timeout=2.0)
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{w.ports['health']}/readyz") as r:
            assert r.status == 503 and "starting" in await r.text()
        with anyio.fail_after(10):
            w.stop()
            await w.wait_done()
    assert w.failure is None and not w.ready


async def _done(key: ObjectKey, ctx: ReconcileContext) -> Result:
    return DONE


async def test_a_second_sigterm_stops_at_once_without_draining(
    worker_settings: Callable[..., WorkerSettings], kube: Kube, namespace: str
) -> None:
    """The first SIGTERM waits for the in-flight reconcile (up to shutdown_timeout, 60 s here);
    a second one stops at once and run_worker returns 1."""
    import logging
    import os
    import signal

    from shared.worker import run_worker

    started, finished = anyio.Event(), anyio.Event()

    async def stuck(key: ObjectKey, ctx: ReconcileContext) -> Result:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            finished.set()
        return DONE

    def setup(ctx: WorkerContext) -> list[Controller]:
        return [ctx.controller("stuck", stuck, ctx.for_(ctx.informers(SECRETS)))]

    await kube.writer.create(SECRETS, {"metadata": {"name": "s1", "namespace": namespace}, "data": {}})
    settings = worker_settings("sig", bus={"shards": 1}, shutdown_timeout=60.0)
    codes: list[int] = []
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level  # run_worker installs its JSON handler
    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:

                async def run() -> None:
                    codes.append(await run_worker("signal-test", settings, setup))

                tg.start_soon(run)
                await started.wait()
                os.kill(os.getpid(), signal.SIGTERM)
                with anyio.move_on_after(1.0):  # the graceful stop waits for the reconcile: still running
                    await finished.wait()
                assert not codes and not finished.is_set()
                os.kill(os.getpid(), signal.SIGTERM)
    finally:
        root.handlers[:], root.level = handlers, level
    assert codes == [1] and finished.is_set()
