"""`python -m app audit <command>`: parses arguments and delegates to replay/; no logic lives here.

`add_audit(sub)` adds the `audit` group to the subparsers of app/cli.py. Subcommands: replay, batch, coverage, compare,
site.
"""
from __future__ import annotations

import argparse

from app.argtypes import COUNT, POSITIVE, fraction


def _replay(args: argparse.Namespace) -> int:
    from replay.console import ReplayOptions, replay_main
    return replay_main(args.run, ReplayOptions(args.until_step, args.from_checkpoint, args.device, args.backend,
                                               args.corpus, not args.no_progress, args.threads))


def add_replay_command(asub: argparse._SubParsersAction) -> None:
    """`audit replay`."""
    r = asub.add_parser("replay", help="replay steps on this device; MATCH or MISMATCH (first step, stage, element)",
                        description="Exit status: 0 MATCH, 1 MISMATCH, 2 refused input.")
    r.add_argument("--run", required=True, help="run directory")
    r.add_argument("--until-step", type=COUNT, required=True, help="last step to replay (inclusive)")
    r.add_argument("--from-checkpoint", type=POSITIVE, default=None,
                   help="start from the run's checkpoint of this step (default: from the initialization)")
    r.add_argument("--device", default="cpu", help="cpu or cuda")
    r.add_argument("--backend", default="ref", choices=("ref", "triton"),
                   help="op library: ref or triton (the Triton twins on CUDA); a MATCH means the same bits either way")
    r.add_argument("--corpus", default=None, help="read this copy of the corpus (default: the config's, else where the "
                                                 "run read it); manifest differences are reported, the tokens "
                                                 "checked by the step digests")
    r.add_argument("--threads", type=COUNT, default=0,
                   help="torch CPU threads (0: torch's default); bits do not change")
    r.add_argument("--no-progress", action="store_true", help="no live progress display")
    r.set_defaults(func=_replay)


def _batch(args: argparse.Namespace) -> int:
    from replay.batch import BatchOptions, batch_main
    return batch_main(args.run, BatchOptions(args.steps, args.segment, args.address, args.device, args.resources,
                                             args.kind, args.kind_override, args.num_cpus, not args.no_progress,
                                             args.corpus, sample=args.sample, seed=args.seed))


def _coverage(args: argparse.Namespace) -> int:
    from replay.coverage import coverage_main
    return coverage_main(args.run)


def add_batch_commands(asub: argparse._SubParsersAction) -> None:
    """`audit batch` and `audit coverage`."""
    b = asub.add_parser("batch", help="audit step segments on Ray Data; one certificate per segment",
                        description="Exit status: 0 all requested steps MATCH, 1 any MISMATCH (this job or the "
                                    "merged coverage), 2 refused input.")
    b.add_argument("--run", required=True, help="run directory (readable at the same path by every auditor)")
    b.add_argument("--steps", default=":", help="A:B audits steps A..B-1 (default: every logged step)")
    b.add_argument("--segment", type=POSITIVE, default=None,
                   help="steps per segment (default: the run's checkpoint spacing); segments end on checkpoints")
    b.add_argument("--sample", type=fraction, default=None, metavar="FRACTION",
                   help="audit only this fraction of the segments (0 < FRACTION <= 1; ceil(FRACTION * N) of them), "
                        "drawn by --seed; `audit coverage` then says what the sample proves")
    b.add_argument("--seed", type=COUNT, default=None, metavar="S",
                   help="with --sample: the draw's seed (the same run, fraction and seed draw the same segments)")
    b.add_argument("--address", default=None, help="Ray cluster address ('auto': a running `ray start --head`); "
                                                  "default: start a local Ray instance")
    b.add_argument("--device", default="cpu", help="cpu or cuda (cuda: one GPU per auditor)")
    b.add_argument("--kind", default=None, help="run auditors only where the cluster advertises this custom "
                                               "resource, e.g. cpu_x86 or cpu_arm")
    b.add_argument("--resources", default=None, help='per-auditor Ray resources as JSON, e.g. {"cpu_arm": 1} or '
                                                    '{"num_gpus": 1, "num_cpus": 4}; replaces the default')
    b.add_argument("--num-cpus", type=POSITIVE, default=None, help="CPUs of the local Ray instance (default: all)")
    b.add_argument("--corpus", default=None, help="read this copy of the corpus (readable at the same path by every "
                                                 "auditor); default: the config's, else where the run read it")
    b.add_argument("--kind-override", default=None, help=argparse.SUPPRESS)  # tests: simulate another kind
    b.add_argument("--no-progress", action="store_true", help="no live progress display")
    b.set_defaults(func=_batch)
    c = asub.add_parser("coverage", help="merge every audit job's certificates of a run: table, map, verdict",
                        description="Exit status: 0 VERIFIED, 1 FAILED, 3 INCOMPLETE, 2 refused input.")
    c.add_argument("--run", required=True, help="run directory")
    c.set_defaults(func=_coverage)


def _compare(args: argparse.Namespace) -> int:
    from replay.compare import compare_main
    return compare_main(args.a, args.b)


def add_compare_command(asub: argparse._SubParsersAction) -> None:
    """`audit compare`."""
    c = asub.add_parser("compare", help="two hash logs of a run: IDENTICAL, SAME BITS (only the topologies differ), "
                                        "SAME TRAJECTORY (only the code version and the hashes that include it "
                                        "differ) or DIFFERENT (first step, fields)",
                        description="Exit status: 0 IDENTICAL or SAME BITS, 3 SAME TRAJECTORY, 1 DIFFERENT, "
                                    "2 refused input.")
    c.add_argument("a", help="run directory or hash log file")
    c.add_argument("b", help="run directory or hash log file")
    c.set_defaults(func=_compare)


def _site(args: argparse.Namespace) -> int:
    from replay.site.build import SiteOptions, site_main
    return site_main(args.run, args.out, SiteOptions(args.documents_steps, args.corpus))


def add_site_command(asub: argparse._SubParsersAction) -> None:
    """`audit site`."""
    s = asub.add_parser("site", help="a static website of a run: overview, plots, every step, a view per step",
                        description="Reads the run directory and its certificates, never writes there; the site "
                                    "works from file:// and from any static web server. Exit status: 0 written, "
                                    "2 refused input.")
    s.add_argument("--run", required=True, help="run directory")
    s.add_argument("--out", required=True, help="site directory (new, or an earlier site, which is replaced)")
    s.add_argument("--documents-steps", default="0:50",
                   help="A:B lists the documents of steps A..B-1 in their step views (default 0:50); MISMATCH steps "
                        "always")
    s.add_argument("--corpus", default=None, help="read the documents from this copy of the corpus (default: the "
                                                 "run's, as its config and run.json name it)")
    s.set_defaults(func=_site)


def add_audit(sub: argparse._SubParsersAction) -> None:
    """The `audit` group."""
    audit = sub.add_parser("audit", help="replay steps and certify a run: replay, batch, coverage, compare, site")
    asub = audit.add_subparsers(dest="audit_cmd", required=True)
    add_replay_command(asub)
    add_batch_commands(asub)
    add_compare_command(asub)
    add_site_command(asub)
