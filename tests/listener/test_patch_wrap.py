"""Patch ID wrap end to end (issue 6): a listener whose sequence is about to reach
2^31-1 publishes ... 2147483646, 2147483647, 1, 2 on the bus — it wraps past the int32 maximum
and skips 0 (which means "idle at minimum, authoritative" to the runner-set).

The seam: :class:`services.listener.service.Listener` starts every leadership term with a fresh
``ScalerState()``; the test makes that fresh state start near the top of the range.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from services.listener import service
from services.listener.scaling import MAX_PATCH_ID, ScalerState
from shared.listener_config import ListenerConfig
from tests.fixtures.actions_sim import ActionsSim
from tests.listener.conftest import BusTap, ScaleSet, start_listener

pytestmark = pytest.mark.anyio


async def test_patch_ids_wrap_past_int32_max_to_one_on_the_bus(
    actions_sim: ActionsSim,
    scale_set: ScaleSet,
    make_config: Callable[..., ListenerConfig],
    bus_tap: BusTap,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert MAX_PATCH_ID == 2147483647
    monkeypatch.setattr(service, "ScalerState", lambda: ScalerState(patch_seq=MAX_PATCH_ID - 2))
    await actions_sim.control.configure(poll_wait=0.2)  # each empty poll is one more decision
    # Assigned jobs keep the target above min_runners, so every decision carries the sequence
    # value (an idle set at its minimum would publish 0 instead).
    await actions_sim.control.enqueue_jobs(count=2, labels=[scale_set.name])
    async with anyio.create_task_group() as tg:
        listener = await start_listener(tg, make_config(min_runners=0, max_runners=10), "listener-wrap")
        await bus_tap.wait_for(lambda t: len(t.desired) >= 5, timeout=15)
        tg.cancel_scope.cancel()

    published = bus_tap.desired[:5]
    assert [d.patch_id for d in published] == [2147483646, 2147483647, 1, 2, 3]
    assert all(d.replicas == 2 and d.listener_epoch == listener.epoch for d in published)
    assert all(d.patch_id != 0 for d in bus_tap.desired)
