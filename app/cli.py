"""`python -m app <group> <command>` (or `auditable <group> <command>`): parses arguments, builds the typed
options, and delegates; no logic lives here."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from app.argtypes import COUNT, POSITIVE, positive_float

EXIT_STATUS = ("Exit status: 0 done; 2 refused input (a bad argument, a missing or malformed file, run directory or "
               "corpus): one line `error: ...` on stderr names it, what was expected and what to do. `audit` commands "
               "also exit 1 (MISMATCH, FAILED, DIFFERENT) and 3 (INCOMPLETE, SAME TRAJECTORY): see `audit <command> "
               "--help`; `demo` exits 1 when its self-check fails or the run is FAILED, 3 when INCOMPLETE. A traceback "
               "is a bug in this program.")


def _demo(args: argparse.Namespace) -> int:
    from app.demo import main as demo
    return demo(args.steps, args.out, args.workers, args.local)


def _train(args: argparse.Namespace) -> int:
    """Builds the run's config and options once; the trainers take them as they are."""
    from training.config import Topology
    from training.presets import run_config
    from training.train import TrainOptions

    if args.workers and args.topology is not None:
        print("error: --workers: the topology is the real one ((world / --dp-shard) x --dp-shard); drop --topology",
              file=sys.stderr)
        return 2
    for flag, value in (("--dp-shard", args.dp_shard), ("--gpus-per-worker", args.gpus_per_worker)):
        if not args.workers and value is not None:
            print(f"error: {flag}: only with --workers (a one-process run's mesh is --topology RxS)", file=sys.stderr)
            return 2
    cfg = run_config(args.config, args.micro_batch, args.corpus, args.reduction)
    topology = {"topology": Topology.parse(args.topology)} if args.topology is not None else {}
    opts = TrainOptions(args.steps, progress=not args.no_progress and not args.workers, **topology,
                        **_given(args, "checkpoint_every", "eval_every", "device", "backend", "threads"))
    if args.workers:
        from training.ray_train import ClusterOptions, main as ray_train, parse_workers
        cluster = ClusterOptions(parse_workers(args.workers),
                                 **_given(args, "address", "max_failures", "dp_shard", "gpus_per_worker"))
        return ray_train(cfg, args.out, opts, cluster, args.resume)
    from training.train import main as train
    return train(cfg, args.out, opts, args.resume)


def _report(args: argparse.Namespace) -> int:
    from training.report import main as report
    return report(args.run, args.steady_after)


def _given(args: argparse.Namespace, *names: str) -> dict:
    """The options the command line set; the rest keep their dataclass's defaults (stated there only)."""
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def _add_train(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="train a model; every step hashed into the run's chain")
    t.add_argument("--config", default="tiny", help="preset: tiny, small, small-parity, tiny-moe, open-1b")
    t.add_argument("--steps", type=POSITIVE, required=True, help="train until this many steps are done")
    t.add_argument("--out", required=True, help="run directory (never overwritten; see --resume)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    t.add_argument("--checkpoint-every", type=COUNT, help="steps between checkpoints (0: only the last)")
    t.add_argument("--eval-every", type=COUNT, help="steps between held-out evaluations (0: none)")
    t.add_argument("--topology", help="virtual data-parallel mesh dp_replicate x dp_shard, e.g. 2x2")
    t.add_argument("--micro-batch", type=POSITIVE, default=None,
                   help="sequences per microbatch (default: the config's)")
    t.add_argument("--reduction", default=None, choices=("exact", "ordered"),
                   help="gradient reduction (default: the config's, exact): exact gives the same bits on any mesh; "
                        "ordered (float32 on the wire) bits that depend on it")
    t.add_argument("--corpus", default=None, help="corpus directory (default: the config's)")
    t.add_argument("--device", help="cpu (default) or cuda")
    t.add_argument("--backend", choices=("ref", "triton"),
                   help="op library: ref (kernels/ref) or triton (the Triton twins on CUDA); the bits are the same")
    t.add_argument("--no-progress", action="store_true", help="no live progress display")
    t.add_argument("--threads", type=COUNT, help="torch CPU threads (0: torch's default); bits do not change")
    t.add_argument("--workers", default=None, help="train on Ray Train workers: N or MIN:MAX (elastic); "
                   "default: this process only")
    t.add_argument("--address", default=None, help="with --workers: Ray cluster address (default: RAY_ADDRESS, "
                   "else a running local cluster, else a new one)")
    t.add_argument("--max-failures", type=int, help="with --workers: worker-group restarts allowed")
    t.add_argument("--gpus-per-worker", type=positive_float, help="with --workers --device cuda: GPUs per worker "
                   "(default 1, NCCL; a share such as 0.5 puts workers on one GPU, gloo)")
    t.add_argument("--dp-shard", type=POSITIVE, help="with --workers: HSDP, workers per replica that shard "
                   "the optimizer state (topology (workers / S) x S; default 1: plain data parallelism)")
    t.set_defaults(func=_train)
    r = sub.add_parser("report", help="plots and gradient-norm statistics of a run")
    r.add_argument("--run", required=True, help="run directory")
    r.add_argument("--steady-after", type=COUNT, default=None, help="steady state starts after this step")
    r.set_defaults(func=_report)


def _data(args: argparse.Namespace) -> int:
    from stream import data_cli
    if args.data_cmd == "build-demo":
        return data_cli.build_demo_main(args.out, args.vocab_size)
    if args.data_cmd == "prepare":
        return data_cli.prepare_main(args.config, args.vocab_size)
    if args.run is not None:
        given = [f"--{n.replace('_', '-')}" for n in ("seq_len", "seed", "schedule", "windows_per_step", "states")
                 if getattr(args, n) is not None]
        if given:
            print(f"error: {given[0]}: --run takes the schedule and seed from the run's config; drop {given[0]}",
                  file=sys.stderr)
            return 2
        from replay.documents import inspect_main
        return inspect_main(args.run, args.step, args.corpus, args.world, args.json)
    return data_cli.inspect_main(args.step, **_given(args, "corpus", "seq_len", "seed", "schedule", "windows_per_step",
                                                     "world", "states"), as_json=args.json)


def _add_data(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="the canonical data stream: corpora, manifests, provenance")
    dsub = data.add_subparsers(dest="data_cmd", required=True)
    b = dsub.add_parser("build-demo", help="write the embedded demo corpus (no network)")
    b.add_argument("--out", default="data/demo", help="corpus directory (default data/demo)")
    b.add_argument("--vocab-size", type=POSITIVE, default=4096)
    pr = dsub.add_parser("prepare", help="tokenizer + manifest + tokenized cache for a corpus config")
    pr.add_argument("--config", required=True, help="corpus config (.json or .toml)")
    pr.add_argument("--vocab-size", type=POSITIVE, default=128_256)
    i = dsub.add_parser("inspect", help="which documents fed each window of a step")
    i.add_argument("--step", type=COUNT, required=True)
    i.add_argument("--run", default=None, help="a run directory: its corpus, schedule and seed (from its config), "
                                              "and each piece's text")
    i.add_argument("--corpus", default=None, help="corpus directory (default data/demo; with --run the run's)")
    i.add_argument("--seq-len", type=POSITIVE, default=None, help="default: the schedule's")
    i.add_argument("--seed", type=int, default=None, help="default 42")
    i.add_argument("--schedule", default=None, help="batch preset: demo (default) or open-1b")
    i.add_argument("--windows-per-step", type=POSITIVE, default=None, help="a constant batch instead of a preset")
    i.add_argument("--world", type=POSITIVE, default=None, help="show the owning data-parallel rank of each window")
    i.add_argument("--states", default=None, help="directory of saved stream states to seek from")
    i.add_argument("--json", action="store_true", help="JSON rows instead of a table")
    data.set_defaults(func=_data)


def _quant(args: argparse.Namespace) -> int:
    """Builds the ARVQ configs once (each validates itself); what the command line leaves unset keeps their defaults."""
    from dataclasses import replace

    from quant.fit import FitConfig
    from quant.pipeline import parse_layers

    if args.quant_cmd == "run":
        from quant.calib import CalibConfig
        from quant.pv import PVConfig
        from quant.sequential import RunSpec, run_main
        pv = replace(PVConfig(), emulate=args.emulate, **_given(args, "updates", "micro_rows", "reassign_every"))
        calib = CalibConfig(**({"train": args.calib_windows} if args.calib_windows is not None else {}),
                            **_given(args, "corpus"))
        spec = RunSpec(args.model, args.out, layers=tuple(parse_layers(args.layers)) if args.layers else None,
                       compare=not args.no_compare, pv=pv, calib=calib,
                       **_given(args, "target", "hot_per_layer", "gang", "boundary_weight"))
        return run_main(spec, args.threads or 0)
    from quant.pipeline import fit_cli
    from quant.synthetic import SyntheticConfig
    synth = SyntheticConfig(**_given(args, "experts", "hidden", "ffn", "tokens", "top_k"))
    cfg = FitConfig(**_given(args, "sample_groups", "metric", "beam", "seed", "device"))
    return fit_cli(args.model, args.layers, args.out, synth, cfg, args.threads or 0, compare=not args.no_compare,
                   **_given(args, "hot_count", "hot_share", "hot_scope", "text_weight", "held_out"))


def _add_quant(sub: argparse._SubParsersAction) -> None:
    quant = sub.add_parser("quant", help="ARVQ: 2-bit additive vector quantization of cold MoE experts")
    qsub = quant.add_subparsers(dest="quant_cmd", required=True)
    f = qsub.add_parser("fit", help="hot/cold split and the Hessian-aware initial fit; packed export")
    f.add_argument("--model", required=True, help="RUN_OR_CONFIG; for now synthetic[:SEED] (a synthetic MoE block)")
    f.add_argument("--layers", required=True, help="layer ids: 3, 3-5 or 3,5")
    f.add_argument("--out", required=True, help="output directory (manifest.json + layer_NNNN/*.safetensors)")
    f.add_argument("--hot-count", type=int, default=None, help="keep this many experts hot (overrides --hot-share)")
    f.add_argument("--hot-share", type=float, help="share of experts kept hot")
    f.add_argument("--hot-scope", choices=("global", "layer"), help="rank experts over all layers or per layer")
    f.add_argument("--text-weight", type=float, help="text REAP weight vs other-domain salience")
    f.add_argument("--held-out", type=float, help="share of captured tokens held out for errors")
    f.add_argument("--no-compare", action="store_true", help="skip the RTN/GPTQ 2-bit baselines")
    f.add_argument("--device", help="cpu or cuda")
    f.add_argument("--sample-groups", type=int, help="codebook EM sample per expert")
    f.add_argument("--metric", choices=("ldl", "l2"), help="group assignment distance")
    f.add_argument("--beam", type=int, help="c0 beam of the group search (0: greedy + alternating)")
    f.add_argument("--seed", type=int, help="fit seed")
    f.add_argument("--threads", type=COUNT, help="torch CPU threads (0: torch's default)")
    f.add_argument("--experts", type=int, help="synthetic: experts per layer")
    f.add_argument("--hidden", type=int, help="synthetic: hidden size (multiple of 128)")
    f.add_argument("--ffn", type=int, help="synthetic: expert ffn size (multiple of 128)")
    f.add_argument("--tokens", type=int, help="synthetic: captured tokens per layer")
    f.add_argument("--top-k", type=int, help="synthetic: experts per token")
    r = qsub.add_parser("run", help="the sequential per-layer pipeline on a trained MoE run: fit, PV, gates, publish")
    r.add_argument("--model", required=True, help="run directory of a trained MoE (e.g. runs/tiny-moe), or a Hugging "
                                                  "Face MoE checkpoint directory (Mixtral, Qwen2-MoE, Qwen3-MoE)")
    r.add_argument("--out", required=True, help="output directory; a rerun resumes after its published layers")
    r.add_argument("--layers", default=None, help="layer ids: 0, 0-1 or 0,1 (default: every MoE layer)")
    r.add_argument("--target", choices=("reference", "same_input"), help="PV target")
    r.add_argument("--hot-per-layer", type=int, help="most-loaded experts per layer kept hot")
    r.add_argument("--gang", type=int, help="tune on N Ray actors sharing the experts (0: in process)")
    r.add_argument("--updates", type=int, help="PV updates per layer")
    r.add_argument("--micro-rows", type=int, help="tokens per PV microbatch (4 per update)")
    r.add_argument("--reassign-every", type=int, help="updates between index reassignments (0: never)")
    r.add_argument("--emulate", action="store_true", help="FP4 activation planes + fp16 SwiGLU cold arithmetic")
    r.add_argument("--boundary-weight", type=float, help="loss weight of rows before a separator")
    r.add_argument("--calib-windows", type=int, help="calibration training windows")
    r.add_argument("--corpus", help="calibration corpus directory for a Hugging Face checkpoint (default data/demo; "
                                    "a run uses its own)")
    r.add_argument("--no-compare", action="store_true", help="skip the RTN/GPTQ 2-bit baselines")
    r.add_argument("--threads", type=COUNT, help="torch CPU threads (0: torch's default)")
    quant.set_defaults(func=_quant)


def _add_audit(sub: argparse._SubParsersAction) -> None:
    from app.audit_cli import add_audit
    add_audit(sub)


def build_parser() -> argparse.ArgumentParser:
    name = Path(sys.argv[0]).name
    prog = "python -m app" if name in ("__main__.py", "-c", "") else name  # or the console script, `auditable`
    p = argparse.ArgumentParser(prog=prog, description="Auditable LLM training.", epilog=EXIT_STATUS)
    sub = p.add_subparsers(dest="group", required=True)
    demo = sub.add_parser("demo", help="the whole story on the embedded corpus: a local Ray cluster, elastic "
                          "training of the tiny model, a batch audit of every step, the run's verdict")
    demo.add_argument("--steps", type=POSITIVE, default=200)
    demo.add_argument("--out", default=None, help="run directory (default: the first free runs/demo-N)")
    demo.add_argument("--workers", default=None, help="train on N (or MIN:MAX) Ray Train workers of a local Ray "
                      "instance started and stopped for the demo (no resize, no audit)")
    demo.add_argument("--local", action="store_true", help="train in this process only (no Ray, no audit)")
    demo.set_defaults(func=_demo)
    _add_audit(sub)
    _add_data(sub)
    _add_quant(sub)
    _add_train(sub)
    _note_exit_status(p)
    return p


def _note_exit_status(parser: argparse.ArgumentParser) -> None:
    """Every command's help ends with its exit statuses: its own (audit's are in their descriptions), else 0 / 2."""
    refused = "2 refused input (one line `error: ...` on stderr names the argument or file)"
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for child in (subs[0].choices.values() if subs else ()):
        if not any(isinstance(a, argparse._SubParsersAction) for a in child._actions):
            if "Exit status" not in (child.description or ""):
                child.epilog = (f"Exit status: 0 done (the run VERIFIED, where audited), 1 self-check failed or the run "
                                f"FAILED, 3 INCOMPLETE, {refused}."
                                if child.prog.endswith(" demo") else f"Exit status: 0 done, {refused}.")
        _note_exit_status(child)

def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from training.errors import INPUT_ERRORS
    try:
        return int(args.func(args) or 0)
    except INPUT_ERRORS as e:  # the project's errors name the file, shard or field: the message is the report
        return _refused(f"{type(e).__name__}: {e}")
    except OSError as e:
        path = _named_path(e, args)
        if path is None:  # not a path given on the command line: an internal fault, shown with its traceback
            raise
        return _refused(f"{path}: {e.strerror or type(e).__name__}; check the path given on the command line "
                        f"(it must exist, or its parent directory for an output, and be accessible)")


def _refused(message: str) -> int:
    """Refused input: one line on stderr (a message's own line breaks joined), exit status 2."""
    print("error: " + " ".join(part.strip() for part in message.splitlines() if part.strip()), file=sys.stderr)
    return 2


def _named_path(e: OSError, args: argparse.Namespace) -> str | None:
    """The file of `e` when it is a path the command line named, inside one or on the way to one; else None."""
    named = [os.path.abspath(v) for v in vars(args).values() if isinstance(v, str) and v]
    for f in (e.filename, e.filename2):
        if f is None or isinstance(f, int):
            continue
        p = os.path.abspath(os.fsdecode(f))
        if any(p == n or p.startswith(n.rstrip(os.sep) + os.sep) or n.startswith(p.rstrip(os.sep) + os.sep)
               for n in named):
            return os.fsdecode(f)
    return None
