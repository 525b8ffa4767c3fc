"""Run the simulator in a background thread with its own event loop (tests, embedded default)."""

from __future__ import annotations

import contextlib
import threading
from types import TracebackType

import anyio
import anyio.from_thread
import anyio.lowlevel

from services.embedded.actions_sim.server import Simulator, serve
from services.embedded.actions_sim.settings import SimConfig, completed


class SimulatorThread:
    """``with SimulatorThread(config) as sim: sim.url`` — started on enter, stopped on exit."""

    def __init__(self, config: SimConfig, *, start_timeout: float = 10.0) -> None:
        self.config = completed(config)
        self.url = ""
        self.simulator: Simulator | None = None
        self._start_timeout = start_timeout
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: anyio.Event | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._thread_main, name="actions-sim", daemon=True)
        self._thread.start()
        if not self._ready.wait(self._start_timeout):
            raise RuntimeError("actions simulator did not start in time")
        if self._error is not None:
            raise RuntimeError(f"actions simulator failed to start: {self._error!r}") from self._error

    def _thread_main(self) -> None:
        try:
            anyio.run(self._main)
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._stop = anyio.Event()
        self._token = anyio.lowlevel.current_token()
        async with anyio.create_task_group() as tg:
            self.url, self.simulator = await tg.start(serve, self.config)
            self._ready.set()
            await self._stop.wait()
            tg.cancel_scope.cancel()

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is None:
            return
        if self._stop is not None and self._token is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                anyio.from_thread.run_sync(self._stop.set, token=self._token)
        self._thread.join(timeout)
        self._thread = None

    def __enter__(self) -> SimulatorThread:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
