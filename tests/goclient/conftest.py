"""The Go programs of this directory, built once per session (cached across runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import build


@pytest.fixture(scope="session")
def go_programs() -> dict[str, Path]:
    try:
        return build.build()
    except build.GoMissing as exc:
        pytest.fail(str(exc), pytrace=False)
