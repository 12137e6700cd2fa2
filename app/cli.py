"""`python -m app <group> <command>`: parses arguments and delegates; no logic lives here."""
from __future__ import annotations

import argparse


def _demo(args: argparse.Namespace) -> int:
    from kernels.selfcheck import main as selfcheck
    return selfcheck()


def _data(args: argparse.Namespace) -> int:
    from stream import data_cli
    if args.data_cmd == "build-demo":
        return data_cli.build_demo_main(args.out, args.vocab_size)
    if args.data_cmd == "prepare":
        return data_cli.prepare_main(args.config, args.vocab_size)
    return data_cli.inspect_main(args.step, args.corpus, args.seq_len, args.seed, args.schedule,
                                 args.windows_per_step, args.world, args.states, args.json)


def _add_data(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="the canonical data stream: corpora, manifests, provenance")
    dsub = data.add_subparsers(dest="data_cmd", required=True)
    b = dsub.add_parser("build-demo", help="write the embedded demo corpus (no network)")
    b.add_argument("--out", default="data/demo", help="corpus directory (default data/demo)")
    b.add_argument("--vocab-size", type=int, default=4096)
    pr = dsub.add_parser("prepare", help="tokenizer + manifest + tokenized cache for a corpus config")
    pr.add_argument("--config", required=True, help="corpus config (.json or .toml)")
    pr.add_argument("--vocab-size", type=int, default=128_256)
    i = dsub.add_parser("inspect", help="which documents fed each window of a step")
    i.add_argument("--step", type=int, required=True)
    i.add_argument("--corpus", default="data/demo")
    i.add_argument("--seq-len", type=int, default=None, help="default: the schedule's")
    i.add_argument("--seed", type=int, default=42)
    i.add_argument("--schedule", default="demo", help="batch preset: demo or open-1b")
    i.add_argument("--windows-per-step", type=int, default=None, help="a constant batch instead of a preset")
    i.add_argument("--world", type=int, default=None, help="show the owning data-parallel rank of each window")
    i.add_argument("--states", default=None, help="directory of saved stream states to seek from")
    i.add_argument("--json", action="store_true", help="JSON rows instead of a table")
    data.set_defaults(func=_data)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app", description="Auditable LLM training.")
    sub = p.add_subparsers(dest="group", required=True)
    demo = sub.add_parser("demo", help="the main job on the embedded default")
    demo.set_defaults(func=_demo)
    _add_data(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)
