"""`python -m app <group> <command>`: parses arguments and delegates; no logic lives here."""
from __future__ import annotations

import argparse


def _demo(args: argparse.Namespace) -> int:
    from kernels.selfcheck import main as selfcheck
    return selfcheck()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app", description="Auditable LLM training.")
    sub = p.add_subparsers(dest="group", required=True)
    demo = sub.add_parser("demo", help="the main job on the embedded default")
    demo.set_defaults(func=_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)
