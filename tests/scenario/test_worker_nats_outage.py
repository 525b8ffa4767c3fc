"""Issue 5: while NATS is down, workers keep reconciling from Kubernetes, and catch up when it
returns. The runner worker, with its shards leased in Kubernetes (the default ownership), keeps
turning new EphemeralRunners into pods through a nats-server outage longer than a NATS lease
would have survived, then handles a bus message again once NATS is back."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, cast

import anyio
import pytest

from services.runner.worker import WORKER
from shared.bus import Bus
from shared.bus.messages import JobStarted
from shared.kube.leases import KubeShardOwnership
from shared.worker import SettingsError, WorkerContext, WorkerSettings, running_worker
from shared.worker.runtime import shard_group
from shared.worker.settings import add_worker_arguments, load_worker_settings
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.nats import NatsServer
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.test_runner_helpers import FAST, RunnerEnv, register_scale_set
from tests.scenario.test_runner_jobs import EXPECTED, _event, _job_fields, _registered

pytestmark = pytest.mark.anyio


def _load(argv: list[str], env: dict[str, str]) -> Any:
    parser = argparse.ArgumentParser()
    add_worker_arguments(parser)
    return load_worker_settings(parser.parse_args(argv), env)


def test_ownership_settings_default_to_kubernetes_leases() -> None:
    s = _load([], {})
    assert (s.ownership, s.lease_namespace, s.lease_duration) == ("kube", "", 20.0)
    s = _load(
        [],
        {
            "RUNNERSCALE_OWNERSHIP": "nats",
            "RUNNERSCALE_LEASE_NAMESPACE": "arc-system",
            "RUNNERSCALE_LEASE_DURATION": "9",
        },
    )
    assert (s.ownership, s.lease_namespace, s.lease_duration) == ("nats", "arc-system", 9.0)
    s = _load(
        ["--ownership", "kube", "--lease-duration", "4", "--lease-namespace", "x"], {"RUNNERSCALE_OWNERSHIP": "nats"}
    )
    assert (s.ownership, s.lease_namespace, s.lease_duration) == ("kube", "x", 4.0)
    with pytest.raises(SettingsError, match="RUNNERSCALE_OWNERSHIP"):
        _load(["--ownership", "etcd"], {})
    with pytest.raises(SettingsError, match="RUNNERSCALE_LEASE_DURATION"):
        _load(["--lease-duration", "0.5"], {})
    with pytest.raises(SettingsError, match="RUNNERSCALE_LEASE_NAMESPACE"):
        _load(["--lease-namespace", "Not_A_Namespace"], {})
    # Replicas watching different namespaces reconcile different keys: different shard groups.
    assert shard_group("runner", _load([], {})) == "runner"
    a, b = _load(["--watch-namespace", "b,a"], {}), _load(["--watch-namespace", "a", "--watch-namespace", "b"], {})
    assert (
        shard_group("runner", a)
        == shard_group("runner", b)
        != shard_group("runner", _load(["--watch-namespace", "c"], {}))
    )


async def test_runner_worker_keeps_reconciling_through_a_nats_outage(
    kube: Kube,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
    nats_server: NatsServer,
    bus: Bus,
) -> None:
    env = RunnerEnv(kube, namespace, actions_sim, await register_scale_set(actions_sim), github_secret)
    settings = worker_settings("r0", bus={"shards": 2}, ownership="kube", lease_duration=3.0)
    async with running_worker(WORKER.name, settings, WORKER.setup(FAST)) as w:
        await w.wait_ready()
        env.worker = w
        ctx = w.ctx
        assert ctx is not None
        assert isinstance(ctx.shards, KubeShardOwnership)
        await wait_for(lambda: len(ctx.shards.owned_shards()) == 2, what="both shards owned")
        await env.create_er("er-before")
        await env.wait_pod("er-before")

        await anyio.to_thread.run_sync(nats_server.stop)
        stopped_at = anyio.current_time()
        await wait_for(lambda: not ctx.bus.connected, what="the worker noticed NATS is down")

        # A Kubernetes change during the outage is reconciled: the ER gets registered and a pod.
        await env.create_er("er-during")
        await env.wait_pod("er-during")
        er_during = await _registered(env, "er-during")
        # Still reconciling after a NATS KV lease would have lapsed (its validity is below the TTL).
        lapse = settings.bus.lease_ttl + settings.bus.effective_renew_interval
        await wait_for(
            lambda: anyio.current_time() > stopped_at + lapse, timeout=lapse + 5, what="past a NATS lease's lifetime"
        )
        assert len(ctx.shards.owned_shards()) == 2
        await env.create_er("er-later")
        await env.wait_pod("er-later")
        assert len(ctx.shards.owned_shards()) == 2  # ownership never moved

        # NATS returns: the worker's consumers resume and a job event lands on the ER's status.
        await anyio.to_thread.run_sync(nats_server.start)
        await wait_for(lambda: ctx.bus.connected and bus.connected, timeout=30, what="both connections back")
        await bus.publish(_event(JobStarted, env, er_during))

        async def recorded() -> Any:
            cur = await env.er("er-during")
            return cur if _job_fields(cur) == EXPECTED else None

        await wait_for(recorded, timeout=30, what="job fields on status after NATS returned")


async def test_ownership_nats_still_selects_nats_kv_leases(worker_settings: Callable[..., WorkerSettings]) -> None:
    from shared.bus import ShardOwnership

    async with running_worker(
        "ownership-nats-test", worker_settings("r0", bus={"shards": 2}, ownership="nats"), lambda ctx: []
    ) as w:
        await w.wait_ready()
        assert isinstance(cast(WorkerContext, w.ctx).shards, ShardOwnership)
        await wait_for(
            lambda: len(cast(WorkerContext, w.ctx).shards.owned_shards()) == 2, what="both shards owned through NATS KV"
        )
