"""The Procfile names real subcommands with flags their parsers accept."""

import itertools
import shlex

from shared.cli import SUBCOMMANDS
from tests.support.paths import REPO

PROCFILE = REPO / "Procfile"


def _entries() -> dict[str, list[str]]:
    out = {}
    for line in PROCFILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, cmd = line.split(":", 1)
            out[name.strip()] = shlex.split(cmd)
    return out


def test_procfile_lists_every_embedded_process() -> None:
    assert set(_entries()) == {
        "nats",
        "apiserver",
        "actions-sim",
        "node-sim",
        "scale-set",
        "runner-set",
        "runner",
        "listener-pod",
    }


def test_procfile_commands_are_registered_subcommands() -> None:
    for name, argv in _entries().items():
        if argv[0] == "runnerscale":
            assert argv[1] in SUBCOMMANDS, f"{name}: unknown subcommand {argv[1]}"


def test_procfile_listens_on_loopback_only() -> None:
    """A development machine's workers serve /metrics and probes on 127.0.0.1, never on every
    interface (issue 11); nats-server is bound with -a 127.0.0.1."""
    for name, argv in _entries().items():
        for flag, value in itertools.pairwise(argv):
            if flag.endswith("-addr"):
                assert value.startswith("127.0.0.1:"), f"{name}: {flag} {value}"
        if argv[0] == "nats-server":
            assert argv[argv.index("-a") + 1] == "127.0.0.1"


def test_procfile_bus_is_authenticated_one_user_per_worker() -> None:
    """nats-server reads the users of `runnerscale bus local-credentials`; each worker connects as
    its own user with its password file (README "Authentication and permissions")."""
    entries = _entries()
    nats = entries["nats"]
    assert nats[nats.index("-c") + 1] == ".runnerscale/nats-auth.conf"
    for name, argv in entries.items():
        if "--nats-url" in argv:
            assert argv[argv.index("--nats-user") + 1] == name
            assert argv[argv.index("--nats-password-file") + 1] == f".runnerscale/nats-{name}.password"
