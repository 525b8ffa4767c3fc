"""Run every benchmark in tests/bench/ and print one table each: `make bench`.

A benchmark is a module ``tests/bench/bench_<name>.py`` with ``run() -> Table``. They are not
collected by pytest (timing targets live here, not in unit tests); each module may also have a
small smoke test under tests/ that calls ``run(quick=True)``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import tests.bench as pkg
from tests.bench.table import Table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench")
    parser.add_argument("names", nargs="*", help="benchmark names (default: all), e.g. semantic bus")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args(argv)
    names = [m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name.startswith("bench_")]
    if args.names:
        names = [n for n in names if n.removeprefix("bench_") in args.names]
    for name in sorted(names):
        module = importlib.import_module(f"tests.bench.{name}")
        table: Table = module.run(quick=args.quick)
        print(table.render())
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
