"""``runnerscale actions-sim`` as a process: prints its URL, honours the seed file, stops on SIGTERM."""

from __future__ import annotations

import json
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.embedded.actions_sim.control_client import SyncSimControl


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(timeout=max(deadline - time.monotonic(), 0)):
            return proc.stdout.readline().strip()
    raise TimeoutError("the simulator printed no URL in time")


def test_cli_serves_seeded_orgs_and_stops_on_sigterm(tmp_path: Path) -> None:
    seed = tmp_path / "seed.yaml"
    seed.write_text("orgs: [acme, umbrella]\nrunner_groups: [gpu]\nsettings: {poll_wait: 2}\n")
    creds = tmp_path / "creds.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shared.cli",
            "actions-sim",
            "--port",
            "0",
            "--seed-file",
            str(seed),
            "--pat",
            "ghp_cli_test_pat_value",
            "--credentials-out",
            str(creds),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = _read_line(proc, timeout=20)
        assert url.startswith("http://127.0.0.1:")
        saved = json.loads(creds.read_text())
        assert saved["url"] == url and saved["pat"] == "ghp_cli_test_pat_value" and saved["org"] == "acme"
        assert "PRIVATE KEY" in saved["app_private_key_pem"]
        assert creds.stat().st_mode & 0o077 == 0
        assert SyncSimControl(url).settings().poll_wait == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        stderr = proc.stderr.read() if proc.stderr else ""
        assert "ghp_cli_test_pat_value" not in stderr and "PRIVATE KEY" not in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_cli_rejects_a_bad_seed_file(tmp_path: Path) -> None:
    seed = tmp_path / "seed.yaml"
    seed.write_text("orgz: [typo]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "shared.cli", "actions-sim", "--port", "0", "--seed-file", str(seed)],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "orgz" in proc.stderr and "Traceback" not in proc.stderr
