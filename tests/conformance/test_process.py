"""`runnerscale apiserver` as a separate process: URL on stdout, kubeconfig, CRDs, clean SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from .conftest import DATA


def test_apiserver_process_lifecycle(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shared.cli",
            "apiserver",
            "--port",
            "0",
            "--kubeconfig-out",
            str(kubeconfig),
            "--crds",
            str(DATA / "crds.yaml"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert url.startswith("http://127.0.0.1:"), url
        doc = yaml.safe_load(kubeconfig.read_text())
        assert doc["clusters"][0]["cluster"]["server"] == url
        assert doc["current-context"] == "runnerscale-emulator"
        with urllib.request.urlopen(url + "/readyz", timeout=10) as resp:
            assert resp.read() == b"ok"
        with urllib.request.urlopen(url + "/apis/conformance.runnerscale.dev/v1", timeout=10) as resp:
            assert "widgets" in {r["name"] for r in json.loads(resp.read())["resources"]}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_apiserver_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "shared.cli",
                "apiserver",
                "--port",
                str(port),
                "--kubeconfig-out",
                str(tmp_path / "kc"),
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert proc.returncode == 1
    assert "cannot serve" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv", [["--port", "0"], ["--bogus"]])
def test_apiserver_bad_arguments(argv: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "shared.cli", "apiserver", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "usage" in proc.stderr
