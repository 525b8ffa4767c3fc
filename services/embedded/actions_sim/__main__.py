"""``runnerscale actions-sim``: run the GitHub Actions service simulator until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import anyio
import msgspec

from services.embedded.actions_sim.settings import SeedFileError, SimConfig, apply_seed_file, completed, load_seed_file
from services.embedded.actions_sim.tls import make_tls_material
from shared.log import configure_logging, get_logger

log = get_logger(__name__)


class CredentialsOut(msgspec.Struct):
    """What ``--credentials-out`` writes, so other local processes can authenticate (mode 0600)."""

    url: str
    org: str
    pat: str
    app_id: int
    client_id: str
    installation_id: int
    app_private_key_pem: str
    ca_pem: str = ""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="runnerscale actions-sim", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8088, help="port; 0 picks a free one (default 8088)")
    p.add_argument("--seed-file", type=Path, help="YAML/JSON seed: orgs, credentials, settings")
    p.add_argument("--org", action="append", help="seeded organization (repeatable; default octo-org)")
    p.add_argument("--pat", help="the PAT to accept (default: random, see --credentials-out)")
    p.add_argument("--app-id", type=int, help="GitHub App id (default 1001)")
    p.add_argument("--app-private-key-file", type=Path, help="the App's RSA private key PEM (default: generated)")
    p.add_argument("--installation-id", type=int, help="App installation id on the first org (default 2001)")
    p.add_argument("--token-ttl", type=float, help="admin and message-queue token lifetime, seconds")
    p.add_argument("--poll-wait", type=float, help="message long-poll hold before 202, seconds (default 50)")
    p.add_argument("--mode", choices=["dotcom", "ghes"], help="job flow: direct assignment or acquire first")
    p.add_argument("--credentials-out", type=Path, help="write URL and credentials as JSON to this file")
    p.add_argument(
        "--tls", action="store_true", help="serve HTTPS with a generated CA (its PEM goes to --credentials-out)"
    )
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> SimConfig:
    config = SimConfig(host=args.host, port=args.port)
    if args.seed_file:
        config = apply_seed_file(config, load_seed_file(args.seed_file), args.seed_file.parent)
    seed, settings = config.seed, config.settings
    if args.org:
        seed = msgspec.structs.replace(seed, orgs=args.org)
    if args.token_ttl is not None:
        settings = msgspec.structs.replace(settings, admin_token_ttl=args.token_ttl, queue_token_ttl=args.token_ttl)
    if args.poll_wait is not None:
        settings = msgspec.structs.replace(settings, poll_wait=args.poll_wait)
    if args.mode:
        settings = msgspec.structs.replace(settings, mode=args.mode)
    key_pem = config.app_private_key_pem
    if args.app_private_key_file:
        try:
            key_pem = args.app_private_key_file.read_text()
        except OSError as exc:
            raise SeedFileError(f"--app-private-key-file {args.app_private_key_file}: {exc.strerror}") from None
    return completed(
        msgspec.structs.replace(
            config,
            seed=seed,
            settings=settings,
            pat=args.pat or config.pat,
            app_id=args.app_id or config.app_id,
            installation_id=args.installation_id or config.installation_id,
            app_private_key_pem=key_pem,
            tls=make_tls_material([args.host, "localhost"]) if args.tls else None,
        )
    )


async def _run(config: SimConfig, credentials_out: Path | None) -> None:
    from services.embedded.actions_sim.server import serve

    async with anyio.create_task_group() as tg:
        url, _ = await tg.start(serve, config)
        if credentials_out is not None:
            # Written whole (mode 0600 from the start), then renamed: a reader never sees half of it.
            out = anyio.Path(credentials_out)
            partial = out.with_name(f".{out.name}.partial")
            await partial.touch(mode=0o600)
            await partial.write_bytes(
                msgspec.json.encode(
                    CredentialsOut(
                        url=url,
                        org=config.seed.orgs[0],
                        pat=config.pat,
                        app_id=config.app_id,
                        client_id=config.client_id,
                        installation_id=config.installation_id,
                        app_private_key_pem=config.app_private_key_pem,
                        ca_pem=config.tls.ca_pem if config.tls else "",
                    )
                )
            )
            await partial.rename(out)
        print(url, flush=True)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("stopping on signal", signal=signal.Signals(signum).name)
                tg.cancel_scope.cancel()
                break


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    configure_logging(args.log_level)
    try:
        config = build_config(args)
    except (SeedFileError, ValueError) as exc:
        print(f"runnerscale actions-sim: {exc}", file=sys.stderr)
        return 2
    anyio.run(_run, config, args.credentials_out)
    return 0


if __name__ == "__main__":  # pragma: no cover - `python -m services.embedded.actions_sim`
    sys.exit(main(sys.argv[1:]))
