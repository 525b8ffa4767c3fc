"""The `pure` marker (tests/conftest.py) selects the sub-minute loop: tests/unit without servers."""

from __future__ import annotations

import pytest

from tests.conftest import is_pure


def test_this_test_is_marked_pure(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("pure") is not None


@pytest.mark.parametrize(
    ("nodeid", "fixtures", "pure"),
    [
        ("tests/unit/shared/test_semantic.py::test_x", ["anyio_backend"], True),
        ("tests/unit/shared/test_crds_apiserver.py::test_x[emulator]", ["kube_api", "namespace"], False),
        ("tests/unit/suite/test_nats_fixture.py::test_x", ["nats_server"], False),
        ("tests/unit/test_sim.py::test_x", ["actions_sim"], False),
        ("tests/kube/test_informer.py::test_stale_event_detection_is_numeric", [], False),
        ("tests/scenario/test_runner_jobs.py::test_x[emulator]", ["kube_api"], False),
    ],
)
def test_pure_is_the_unit_folder_without_server_fixtures(nodeid: str, fixtures: list[str], pure: bool) -> None:
    assert is_pure(nodeid, fixtures) is pure
