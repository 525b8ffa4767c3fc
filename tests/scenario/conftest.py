"""Shared helpers for scenario tests: a worker against the API emulator, NATS and the Actions sim.

Fixtures (function scope unless noted):

- ``kube`` → :class:`Kube` (``client``, ``reader``, ``writer``) for the API under test.
- ``bus`` → a connected :class:`shared.bus.Bus` on the test's own ``nats_server``.
- ``worker_settings`` → a factory ``(replica_id="r0", **overrides) -> WorkerSettings`` wired to
  the emulator (kubeconfig), the test's nats-server, the test ``namespace``, free ports, short
  leases (NATS ``lease_ttl=3``, Kubernetes shard leases ``lease_duration=6``) and few shards.
- ``github_secret`` → the name of a Secret in ``namespace`` holding the simulator's PAT
  (``github_token``), ARC's format.
- ``runner_env`` → a running runner worker and a registered scale set (``RunnerEnv``).

Helpers: :func:`wait_for` (poll a condition with a deadline, never sleep to synchronise), the
suite's :func:`tests.support.eventually.eventually` with the scenario defaults.

The CRDs of ``deploy/crds/`` are installed into the emulator by the session ``kube_api``
fixture (tests/fixtures/apiserver.py); :func:`require_crds` checks they are served.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

import msgspec
import pytest

from shared.bus import Bus, BusSettings
from shared.kube import SECRETS, ApiReader, ApiWriter, KubeClient, ObjectKey, Resource, retry_on_conflict
from shared.worker import WorkerSettings
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.apiserver import KubeApi
from tests.fixtures.nats import NatsServer
from tests.support.eventually import eventually

if TYPE_CHECKING:  # it imports this module
    from tests.scenario.test_runner_helpers import RunnerEnv

T = TypeVar("T")


@dataclass
class Kube:
    client: KubeClient
    reader: ApiReader
    writer: ApiWriter

    async def edit(
        self, resource: Resource[T], key: ObjectKey | str, patch: Mapping[str, Any], *, status: bool = False
    ) -> T:
        """A user's edit (``kubectl edit``/``patch``) of an object a running worker may write too.

        Reads authoritatively, merge-patches (the ``/status`` subresource when ``status``) locked on
        that read's resourceVersion, and redoes read + write on 409 Conflict, as kubectl does. A
        worker writing the object in between is legitimate, not a failure of the test: a lone
        read-then-patch made tests fail at random on a loaded machine or a real API server. Tests
        of conflict or resourceVersion semantics write with ``self.writer`` directly.
        """
        write = self.writer.patch_status if status else self.writer.patch_merge

        async def read_and_write() -> T:
            current = await self.reader.get(resource, key)
            rv = current.metadata.resource_version  # type: ignore[attr-defined]  # every kind has metadata
            return await write(resource, key, patch, resource_version=rv)

        return await retry_on_conflict(read_and_write, attempts=20)


@pytest.fixture
async def kube(kube_api: KubeApi) -> AsyncIterator[Kube]:
    client = await KubeClient.from_kubeconfig(kube_api.kubeconfig)
    async with client:
        yield Kube(client, ApiReader(client), ApiWriter(client))


def scenario_bus_settings(nats_url: str, **overrides: Any) -> BusSettings:
    base: dict[str, Any] = dict(
        nats_urls=(nats_url,), lease_ttl=3.0, shards=4, connect_timeout=5.0, publish_deadline=10.0
    )
    base.update(overrides)
    return BusSettings(**base)


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[Bus]:
    async with Bus.connect(scenario_bus_settings(nats_server.url), name="scenario-test") as b:
        yield b


@pytest.fixture
def worker_settings(kube_api: KubeApi, nats_server: NatsServer, namespace: str) -> Callable[..., WorkerSettings]:
    def make(replica_id: str = "r0", **overrides: Any) -> WorkerSettings:
        bus_overrides = overrides.pop("bus", {})
        base: dict[str, Any] = dict(
            bus=scenario_bus_settings(nats_server.url, **bus_overrides),
            kubeconfig=str(kube_api.kubeconfig),
            replica_id=replica_id,
            metrics_addr="127.0.0.1:0",
            health_addr="127.0.0.1:0",
            namespaces=(namespace,),
            workers=2,
            actions_timeout=20.0,
            shutdown_timeout=5.0,
            kube_request_timeout=10.0,
            # Kubernetes shard leases of 6 s: request timeout 1.2 s, validity 4.2 s, renewal every 3 s,
            # crash hand-over within 7.8 s (README "Shard ownership leases"). 3 s (a 0.6 s request
            # timeout) made one slow renewal on a loaded 2-core machine drop every shard. Tests of
            # lease timing pass a shorter lease_duration explicitly.
            lease_duration=6.0,
            # The shard leases live and die with the test's namespace (on a real cluster too).
            lease_namespace=namespace,
        )
        base.update(overrides)
        return WorkerSettings(**base)

    return make


async def create_secret(kube: Kube, namespace: str, name: str, data: dict[str, str]) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }
    await kube.writer.create(SECRETS, body)


@pytest.fixture
async def github_secret(kube: Kube, namespace: str, actions_sim: ActionsSim) -> str:
    await create_secret(kube, namespace, "github-config", {"github_token": actions_sim.pat})
    return "github-config"


@pytest.fixture
async def runner_env(
    kube: Kube,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> AsyncIterator[RunnerEnv]:
    """A runner worker and a registered scale set: a ``RunnerEnv`` (tests/scenario/test_runner_helpers.py)."""
    from tests.scenario.test_runner_helpers import start_runner_env  # it imports this module

    async with start_runner_env(kube, namespace, actions_sim, github_secret, worker_settings) as env:
        yield env


# Two signatures, as tests.support.eventually's (mypy infers T from an async predicate's awaited
# value); the value returned is truthy, so never None.
@overload
async def wait_for(
    predicate: Callable[[], Awaitable[T | None]], *, timeout: float = ..., interval: float = ..., what: str = ...
) -> T: ...


@overload
async def wait_for(
    predicate: Callable[[], T | None], *, timeout: float = ..., interval: float = ..., what: str = ...
) -> T: ...


async def wait_for(
    predicate: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"
) -> Any:
    """:func:`tests.support.eventually.eventually` (sync or async ``predicate``; its value is returned)."""
    return await eventually(predicate, timeout=timeout, interval=interval, what=what)


async def require_crds(kube: Kube) -> None:
    """Fail clearly when the actions.github.com CRDs are not served."""
    data = await kube.client.request("GET", "/apis/actions.github.com/v1alpha1", what="discovery")
    names = {r["name"] for r in msgspec.json.decode(data).get("resources", [])}
    missing = {"ephemeralrunnersets", "ephemeralrunners", "autoscalingrunnersets", "autoscalinglisteners"} - names
    assert not missing, f"CRDs not installed in the API under test: {sorted(missing)}"
