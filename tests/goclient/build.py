"""Build the Go programs of ``tests/goclient`` from the Go module proxy, cached by source hash.

The binaries live outside the checkout, in ``~/.cache/runnerscale/goclient/<hash>/`` (or
``$RUNNERSCALE_CACHE/goclient/``), keyed by the module's sources and the Go version, so later
runs reuse them. The build uses ``-trimpath`` and the module versions of the control-plane
build (k8s.io/* v0.37.2), so both share Go's build cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

MODULE = Path(__file__).resolve().parent
PROGRAMS = ("goclient", "prototables", "bodies")
GO_HINT = (
    "the Go client test builds tests/goclient with Go >= 1.26 from the Go module proxy; "
    "put `go` on PATH (your distribution's golang package, or the toolchain from go.dev/dl) and re-run"
)


class GoMissing(RuntimeError):
    pass


def cache_root() -> Path:
    base = os.environ.get("RUNNERSCALE_CACHE") or os.path.join(Path.home(), ".cache", "runnerscale")
    return Path(base) / "goclient"


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise GoMissing(GO_HINT)
    return go


def _env() -> dict[str, str]:
    # A local toolchain only (never a toolchain download), and go.sum must already be complete.
    return {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly -buildvcs=false"}


def source_hash(go: str) -> str:
    h = hashlib.sha256()
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True, timeout=60).stdout
    h.update(version.encode())
    for path in sorted(MODULE.rglob("*")):
        if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
            h.update(str(path.relative_to(MODULE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build(timeout: float = 1500.0) -> dict[str, Path]:
    """Paths of the built programs (built now if the cache has none for these sources)."""
    go = _go()
    target = cache_root() / source_hash(go)
    paths = {name: target / name for name in PROGRAMS}
    if all(p.exists() for p in paths.values()):
        return paths
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    try:
        proc = subprocess.run(
            [go, "build", "-trimpath", "-o", str(scratch) + os.sep, ".", "./prototables", "./bodies"],
            check=False,
            cwd=MODULE,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"go build of tests/goclient failed:\n{proc.stdout}{proc.stderr}")
        try:
            scratch.rename(target)  # atomic: concurrent builders race, one wins, all agree
        except OSError:
            if not all(p.exists() for p in paths.values()):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return paths
