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
]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"
