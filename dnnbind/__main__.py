"""Command line: ``python -m dnnbind doctor`` (also the ``dnnbind`` console script)."""

from __future__ import annotations

import argparse
import json
import sys

from .doctor import check_report, collect_report, doctor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dnnbind", description="dnnbind command line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="show the CUDA/cuDNN/cuBLAS set-up and check that it is consistent")
    doc.add_argument("--json", action="store_true", help="print the collected report as JSON and the problems")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        if args.json:
            report = collect_report()
            problems = check_report(report)
            print(json.dumps({"report": report, "problems": [list(p) for p in problems]}, indent=2, default=str))
            return 1 if problems else 0
        return doctor()
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first
    return 2


if __name__ == "__main__":
    sys.exit(main())
