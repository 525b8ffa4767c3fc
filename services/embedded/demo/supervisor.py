"""Run the embedded default's child processes under one anyio task group.

Each child is a command with a readiness probe (a TCP port that must accept connections).
Children's output lines are forwarded with a name prefix. Leaving the context terminates every
child (SIGTERM, then SIGKILL after a grace period), whatever way the context is left.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TextIO

import anyio
from anyio.abc import Process, TaskGroup


class ChildFailed(RuntimeError):
    """A child process exited or never became ready."""


@dataclass
class ChildSpec:
    name: str
    argv: Sequence[str]
    ready_port: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _port_open(port: int) -> bool:
    try:
        stream = await anyio.connect_tcp("127.0.0.1", port)
    except OSError:
        return False
    await stream.aclose()
    return True


class Supervisor:
    def __init__(self, tg: TaskGroup, out: TextIO | None = None) -> None:
        self._tg = tg
        self._out = out or sys.stdout
        self._children: list[tuple[ChildSpec, Process]] = []

    async def start(self, spec: ChildSpec) -> Process:
        env = {**os.environ, **spec.env}
        proc = await anyio.open_process(
            list(spec.argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self._children.append((spec, proc))
        self._tg.start_soon(self._forward, spec.name, proc)
        if spec.ready_port is not None:
            with anyio.fail_after(spec.ready_timeout):
                while not await _port_open(spec.ready_port):
                    if proc.returncode is not None:
                        raise ChildFailed(f"{spec.name} exited with {proc.returncode} before it was ready")
                    await anyio.sleep(0.1)  # polling a port under a deadline
        return proc

    async def _forward(self, name: str, proc: Process) -> None:
        assert proc.stdout is not None
        buffered = b""
        async for chunk in proc.stdout:
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                print(f"[{name}] {line.decode(errors='replace')}", file=self._out, flush=True)

    async def stop_all(self, grace: float = 10.0) -> None:
        for _spec, proc in reversed(self._children):
            if proc.returncode is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for _spec, proc in reversed(self._children):
            with anyio.move_on_after(grace, shield=True) as scope:
                await proc.wait()
            if scope.cancelled_caught and proc.returncode is None:
                proc.kill()
                with anyio.move_on_after(5, shield=True):
                    await proc.wait()


@asynccontextmanager
async def supervised(out: TextIO | None = None) -> AsyncIterator[Supervisor]:
    async with anyio.create_task_group() as tg:
        sup = Supervisor(tg, out)
        try:
            yield sup
        finally:
            with anyio.CancelScope(shield=True):
                await sup.stop_all()
            tg.cancel_scope.cancel()
