import subprocess
import sys

import pytest

from shared.cli import main


def test_version_prints_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out and out[0].isdigit()


def test_unknown_command_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_console_script_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shared.cli", "version"], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
