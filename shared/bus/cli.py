"""``runnerscale bus``: set up and inspect the bus without the NATS CLI.

runnerscale bus setup     create or check every stream and bucket (exit 1 on a conflict)
runnerscale bus status    streams, consumers, shard owners and leaders, as JSON lines
runnerscale bus local-credentials --dir DIR
                          write nats-auth.conf and a password file per component (the Procfile)
runnerscale bus secret    print a Secret with a fresh NATS password per component (JSON, for
                          ``kubectl apply -f -``; README "Authentication and permissions")
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio
import msgspec
import nats.js.errors

from shared.bus import permissions, subjects
from shared.bus.bus import Bus
from shared.bus.errors import BusError, SettingsError
from shared.bus.settings import BusSettings, add_bus_arguments, load_settings


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="runnerscale bus", description="set up and inspect the NATS bus")
    parser.add_argument("action", choices=["setup", "status", "secret", "local-credentials"])
    parser.add_argument("--dir", default=".runnerscale", help="where local-credentials writes its files")
    parser.add_argument("--namespace", default="runnerscale-system", help="namespace of the Secret (secret)")
    parser.add_argument("--secret-name", default="runnerscale-nats-auth", help="name of the Secret (secret)")
    add_bus_arguments(parser)
    args = parser.parse_args(argv)
    if args.action == "local-credentials":
        written = permissions.write_local_credentials(Path(args.dir))
        print(msgspec.json.encode({"ok": True, "dir": args.dir, "users": sorted(written)}).decode())
        return 0
    if args.action == "secret":  # needs no NATS: the passwords are made here, printed once
        print(msgspec.json.encode(permissions.auth_secret(args.namespace, args.secret_name)).decode())
        return 0
    try:
        settings = load_settings(args)
        return anyio.run(_setup if args.action == "setup" else _status, settings)
    except (BusError, SettingsError) as exc:
        print(f"runnerscale bus: {exc}", file=sys.stderr)
        return 1


async def _setup(settings: BusSettings) -> int:
    async with Bus.connect(settings, name="runnerscale-bus-setup") as bus:
        # What was created or checked: everything, or a component user's own (README
        # "Authentication and permissions").
        streams = subjects.STREAMS if bus.uses is None else bus.uses.streams
        buckets = subjects.BUCKETS if bus.uses is None else bus.uses.buckets
    names = [s.name for s in streams] + [f"KV_{b}" for b in buckets]
    print(msgspec.json.encode({"ok": True, "streams": names}).decode())
    return 0


async def _status(settings: BusSettings) -> int:
    out = sys.stdout
    async with Bus.connect(settings, name="runnerscale-bus-status", setup=False) as bus:
        for spec in subjects.STREAMS:
            try:
                info = await bus.js.stream_info(spec.name)
            except nats.js.errors.NotFoundError:
                print(msgspec.json.encode({"stream": spec.name, "missing": True}).decode(), file=out)
                continue
            row = {"stream": spec.name, "messages": info.state.messages, "last_seq": info.state.last_seq}
            print(msgspec.json.encode(row).decode(), file=out)
            for consumer in await bus.js.consumers_info(spec.name):
                row = {
                    "stream": spec.name,
                    "consumer": consumer.name,
                    "pending": consumer.num_pending,
                    "unacked": consumer.num_ack_pending,
                    "redelivered": consumer.num_redelivered,
                }
                print(msgspec.json.encode(row).decode(), file=out)
        for bucket in subjects.BUCKETS:
            try:
                kv = await bus.js.key_value(bucket)
                keys = await kv.keys()
            except (nats.js.errors.BucketNotFoundError, nats.js.errors.NoKeysError):
                continue
            for key in sorted(keys):
                try:
                    entry = await kv.get(key)
                except nats.js.errors.KeyNotFoundError:
                    continue
                holder = msgspec.json.decode(entry.value or b"{}")
                print(
                    msgspec.json.encode(
                        {"bucket": bucket, "key": key, "holder": holder, "revision": entry.revision}
                    ).decode(),
                    file=out,
                )
    return 0
