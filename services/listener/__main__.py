"""``runnerscale listener --config FILE``: one Actions message session per scale set.

Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT), 2 for an invalid configuration, 1 when
the listener gave up (e.g. the scale set no longer exists; the pod's owner recreates it) or a
second signal cut the clean shutdown short.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import anyio

from services.listener.session import ListenerGaveUp
from shared.listener_config import ConfigError, load_config
from shared.log import configure_logging, get_logger

log = get_logger(__name__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="runnerscale listener", description=__doc__.splitlines()[0])
    p.add_argument(
        "--config",
        default=os.environ.get("LISTENER_CONFIG_PATH", ""),
        help="path of the listener config JSON (default: env LISTENER_CONFIG_PATH)",
    )
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not args.config:
        print("runnerscale listener: --config FILE (or LISTENER_CONFIG_PATH) is required", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"runnerscale listener: invalid config: {exc}", file=sys.stderr)
        return 2
    configure_logging("warning" if cfg.log_level.lower() == "warn" else cfg.log_level)
    # The Actions client takes its proxy from the environment (as ARC's listener does).
    for key, value in (
        ("http_proxy", cfg.proxy.http_proxy),
        ("https_proxy", cfg.proxy.https_proxy),
        ("no_proxy", cfg.proxy.no_proxy),
    ):
        if value:
            os.environ[key] = os.environ[key.upper()] = value
    from services.listener.service import run_listener
    from shared.actions import ActionsError
    from shared.bus import BusError

    async def _run() -> None:
        work = anyio.CancelScope()
        async with anyio.create_task_group() as tg:

            async def _signals() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        if not work.cancel_called:
                            log.info("shutting down", signal=signal.Signals(signum).name)
                            work.cancel()  # graceful: the session is deleted, the lease released
                            continue
                        # A second signal: the operator does not want to wait for the clean-up.
                        log.warning("second signal: exiting at once", signal=signal.Signals(signum).name)
                        os._exit(1)

            tg.start_soon(_signals)
            with work:
                await run_listener(cfg)
            tg.cancel_scope.cancel()

    try:
        anyio.run(_run)
    except BaseException as exc:
        cause = _root_cause(exc)
        if isinstance(cause, KeyboardInterrupt):
            return 0
        if isinstance(cause, (ListenerGaveUp, ActionsError, BusError)):
            log.error("listener stopped", error=str(cause), error_type=type(cause).__name__)
            return 1
        raise
    return 0


def _root_cause(exc: BaseException) -> BaseException:
    """The first leaf of (nested) exception groups raised out of task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc
