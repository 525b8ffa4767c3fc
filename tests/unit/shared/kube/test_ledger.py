"""The one-patch-per-part check (shared/kube/ledger.py), without a server."""

from __future__ import annotations

import anyio
import pytest

from shared.kube.ledger import PatchRecord, RepeatedPatch, note_patch, recording, repeated_patches
from shared.kube.resources import ObjectKey

A = ObjectKey("ns", "a")
B = ObjectKey("ns", "b")
ERS = "ephemeralrunnersets.actions.github.com"


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([], []),
        ([PatchRecord(ERS, A), PatchRecord(ERS, A, "status")], []),  # one of each part
        ([PatchRecord(ERS, A), PatchRecord(ERS, B)], []),  # two objects
        ([PatchRecord(ERS, A), PatchRecord("pods", A)], []),  # same key, two resources
        ([PatchRecord(ERS, A), PatchRecord(ERS, A)], [RepeatedPatch(ERS, A, "", 2)]),
        (
            [PatchRecord(ERS, B, "status")] * 3 + [PatchRecord(ERS, A)] * 2,
            [RepeatedPatch(ERS, A, "", 2), RepeatedPatch(ERS, B, "status", 3)],
        ),
    ],
)
def test_repeated_patches(records: list[PatchRecord], expected: list[RepeatedPatch]) -> None:
    assert repeated_patches(records) == expected


def test_describe_names_the_part_and_object() -> None:
    assert RepeatedPatch(ERS, A, "status", 2).describe() == f"2 status patches of {ERS} ns/a"
    assert RepeatedPatch("nodes", ObjectKey("", "n1"), "", 3).describe() == "3 metadata/spec patches of nodes n1"


def test_patches_outside_a_recording_are_dropped_and_recordings_nest() -> None:
    note_patch(ERS, A, "")  # no ledger: nothing to record into, no error
    with recording() as outer:
        note_patch(ERS, A, "")
        with recording() as inner:
            note_patch(ERS, B, "")
        note_patch(ERS, A, "status")
    assert inner == [PatchRecord(ERS, B)]
    assert outer == [PatchRecord(ERS, A), PatchRecord(ERS, A, "status")]


@pytest.mark.anyio
async def test_tasks_started_inside_a_recording_record_into_it() -> None:
    """A reconcile that writes from child tasks (a task group) still has every patch counted."""
    with recording() as ledger:
        async with anyio.create_task_group() as tg:
            for key in (A, B):
                tg.start_soon(_note, key)
    assert sorted(r.key.name for r in ledger) == ["a", "b"]


async def _note(key: ObjectKey) -> None:
    note_patch(ERS, key, "")
