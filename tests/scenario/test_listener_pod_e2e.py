"""End to end: the listener-pod worker builds the pod, the node simulator runs it as a real
``runnerscale listener`` subprocess (config Secret materialised as a file), and that listener
talks to the Actions simulator and publishes DesiredState on NATS."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.listener_pod import decide
from shared.actions import ActionsClient, PersonalAccessToken
from shared.bus import Bus, DesiredState, subjects
from shared.kube import AUTOSCALING_LISTENERS, AUTOSCALING_RUNNER_SETS, PODS, ObjectKey
from shared.worker import WorkerSettings
from tests.node_sim.helpers import node_config, running_node
from tests.scenario.conftest import Kube, create_secret, require_crds, wait_for
from tests.scenario.test_listener_pod_worker import AL_NAME, ARS_NAME, al_body, ars_body, listener_pod_worker, metric

pytestmark = pytest.mark.anyio


async def test_node_sim_runs_the_listener_pod_and_it_publishes_desired_state(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    actions_sim: Any,
    kube_api: Any,
    bus: Bus,
    tmp_path: Path,
) -> None:
    await require_crds(kube)
    async with ActionsClient.from_config(actions_sim.config_url(), PersonalAccessToken(actions_sim.pat)) as client:
        scale_set = await client.create_scale_set(f"ls-e2e-{namespace}")
    await create_secret(kube, namespace, "github-config", {"github_token": actions_sim.pat})
    ars = ars_body(namespace, "github-config")
    ars["spec"]["githubConfigUrl"] = actions_sim.config_url()
    await kube.writer.create(AUTOSCALING_RUNNER_SETS, ars)
    await kube.writer.create(
        AUTOSCALING_LISTENERS,
        al_body(
            namespace,
            "github-config",
            githubConfigUrl=actions_sim.config_url(),
            runnerScaleSetId=scale_set.id,
            minRunners=2,
            maxRunners=5,
        ),
    )
    # A real image name is irrelevant to the node simulator: the annotation makes it a process pod.
    options = decide.ListenerPodSettings(
        image="example.com/runnerscale:e2e",
        metrics_addr="127.0.0.1:0",
        health_addr="127.0.0.1:0",
        log_level="debug",
        resync_seconds=30.0,
    )
    async with (
        running_node(node_config(kube_api, namespace, tmp_path)) as node,
        listener_pod_worker(worker_settings(), options) as (_, registry),
    ):

        async def running() -> Any:
            pod = await kube.reader.get_or_none(PODS, ObjectKey(namespace, AL_NAME))
            cs = pod.status.container("listener") if pod is not None else None
            return pod if cs is not None and cs.state.running is not None else None

        await wait_for(running, timeout=30, what="listener container running under the node simulator")

        async def published() -> DesiredState | None:
            msg = await bus.last_message(subjects.desired_subject(namespace, ARS_NAME))
            return msg if isinstance(msg, DesiredState) else None

        try:
            state = await wait_for(published, timeout=45, what="DesiredState from the listener subprocess")
        except AssertionError:
            print("\n".join(node.logs(namespace, AL_NAME) or []))
            raise
        assert state.scale_set_id == scale_set.id
        assert (state.ers.namespace, state.ers.name) == (namespace, ARS_NAME)
        assert state.replicas == 2, "min runners, no jobs"
        labels = dict(name=AL_NAME, namespace=namespace, repository="", organization="octo-org", enterprise="")
        await wait_for(
            lambda: metric(registry, "gha_controller_running_listeners", **labels) == 1, what="running gauge"
        )

        # A config change must reach the *running* listener: the Secret data is rewritten, the
        # pod restarted (config revision), and the new process publishes the new level.
        first_uid = (await kube.reader.get(PODS, ObjectKey(namespace, AL_NAME))).metadata.uid
        await kube.edit(AUTOSCALING_LISTENERS, ObjectKey(namespace, AL_NAME), {"spec": {"minRunners": 3}})

        async def republished() -> DesiredState | None:
            msg = await published()
            return msg if msg is not None and msg.replicas == 3 else None

        try:
            state = await wait_for(
                republished, timeout=45, what="DesiredState with the new minRunners from the restarted listener"
            )
        except AssertionError:
            print("\n".join(node.logs(namespace, AL_NAME) or []))
            raise
        pod = await wait_for(running, timeout=20, what="the new listener pod running")
        assert pod.metadata.uid != first_uid
