"""The success status of every endpoint, as recorded in tests/data/actions/statuses.json (the
real service's codes per the spec), observed on the wire while the client drives every call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.actions import ActionsClient, AppCredentials, MessageSessionClient
from tests.contract.conftest import FAST, pat_client
from tests.fixtures.actions_sim import ActionsSim

pytestmark = pytest.mark.anyio

STATUSES = json.loads((Path(__file__).parent.parent / "data" / "actions" / "statuses.json").read_text())


def allowed(expected: int | str | list[int]) -> set[int]:
    if expected == "2xx":
        return set(range(200, 300))
    return set(expected) if isinstance(expected, list) else {int(expected)}


async def test_every_endpoint_answers_its_recorded_success_status(actions_sim: ActionsSim) -> None:
    await actions_sim.control.configure(poll_wait=0.2, mode="ghes")
    app = AppCredentials(
        app_id=str(actions_sim.app_id),
        installation_id=actions_sim.installation_id,
        private_key=actions_sim.app_private_key_pem,
    )
    async with ActionsClient.from_config(actions_sim.config_url(), app, settings=FAST, environ={}) as client:
        await client.get_runner_group_by_name("Default")
        scale_set = await client.create_scale_set("codes")
        await client.get_scale_set_by_name("codes")
        await client.get_scale_set(scale_set.id)
        await client.update_scale_set(scale_set.id, labels=["codes", "x"])
        jit = await client.generate_jit_config(scale_set.id, "runner-codes")
        await client.get_runner(jit.runner.id)
        await client.get_runner_by_name("runner-codes")
        await client.remove_runner(jit.runner.id)
        assert await client.get_acquirable_jobs(scale_set.id) == []
        async with await MessageSessionClient.create(client, scale_set.id, "me") as session:
            await session.refresh()
            assert await session.get_message(0, max_capacity=2) is None
            await actions_sim.control.enqueue_jobs(count=1, labels=["codes"])
            message = await session.get_message(0, max_capacity=2)
            assert message is not None
            await session.delete_message(message.message_id)
            await session.acquire_jobs([j.runner_request_id for j in message.available])
        await client.delete_scale_set(scale_set.id)
    async with pat_client(actions_sim) as client:  # the PAT path mints a registration token directly
        await client.get_scale_set_by_name("codes")

    seen: dict[str, set[int]] = {}
    for record in await actions_sim.control.requests():
        seen.setdefault(record.endpoint, set()).add(record.status)
    for endpoint, spec in STATUSES.items():
        if endpoint.startswith("_"):
            continue
        assert endpoint in seen, f"{endpoint} was never called"
        assert seen[endpoint] <= allowed(spec["status"]), f"{endpoint}: saw {seen[endpoint]}, spec {spec['status']}"
