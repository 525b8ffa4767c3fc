"""Suite-wide configuration.

Fixtures live in ``tests/fixtures/`` as plugins, one module per real dependency the tests start
(nats-server, the Kubernetes API emulator, the Actions simulator), so any test directory can use
them.
"""

import pytest

pytest_plugins = [
    "tests.fixtures.nats",
    "tests.fixtures.apiserver",
    "tests.fixtures.actions_sim",
    "tests.fixtures.cpu_load",
    "tests.fixtures.one_patch",
]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


# Warnings are errors (pyproject.toml). Two tests of tests/conformance, which other work is editing
# now, leave their subprocess pipes to the garbage collector; until they close them, the
# unraisable ResourceWarning is tolerated in those two tests only.
_PIPES_LEFT_TO_GC = frozenset(
    {
        "tests/conformance/test_process.py::test_apiserver_process_lifecycle",
        "tests/conformance/test_kubectl.py::test_kubectl_workflow",
    }
)


# The sub-minute loop (`make test-pure`, README "Tests, benchmarks, real clusters"): tests/unit
# holds the pure decisions; a test there that asks for one of these fixtures starts a server and is
# not pure. Other directories start servers and processes in many ways (subprocesses, builds), so
# a pure module elsewhere opts in itself with `pytestmark = pytest.mark.pure`.
_PURE_DIR = "tests/unit/"
_SERVER_FIXTURES = frozenset({"kube_api", "nats_server", "nats_url", "actions_sim", "actions_sim_tls"})


def is_pure(nodeid: str, fixturenames: list[str]) -> bool:
    return nodeid.startswith(_PURE_DIR) and not _SERVER_FIXTURES.intersection(fixturenames)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if is_pure(item.nodeid, getattr(item, "fixturenames", [])):
            item.add_marker(pytest.mark.pure)
        if item.nodeid.split("[", 1)[0] in _PIPES_LEFT_TO_GC:  # on either API server
            item.add_marker(pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"))
