"""Batch audits on Ray Data: segments of steps fanned out to an actor pool of auditors, one certificate each.

Segments are [A, A+K), [A+K, A+2K), ... aligned to the run's checkpoints: a segment ends where the next would
start on a checkpoint (checkpoints every 4, K 4 or 6: [0,4) [4,8) ...), so its auditor loads that checkpoint and
replays only the segment. When checkpoints are further apart than K, each gap is cut into near-equal pieces of
at most K; a piece not starting on a checkpoint still works: its auditor replays from the latest checkpoint
before it (or from init), and those warm-up steps cost time but are not certified by it.
With a sample (`--sample FRACTION --seed S`) only a seeded draw of those segments is replayed (replay/sampling.py),
and the job's certificate file records the sample.
The run directory must be readable at the same path by every auditor (one machine, or a shared filesystem);
certificates are written by the driver only, to RUN/audit/certificates/<job-id>.parquet.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import socket
import time
import uuid
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from training.rundir import list_checkpoints
from training.errors import AppError, ConfigError
from training.ray_auth import auth_mode, token_auth
from replay.certificates import SCHEMA, RunLog, write_certificates
from replay.sampling import Sample, check_fraction, check_seed, draw

auth_mode()  # before anything imports ray, which reads RAY_AUTH_MODE once, as it is imported

DEFAULT_SEGMENT = 100  # the report's checkpoint interval; used when a run has no checkpoint spacing to follow


# -- planning ---------------------------------------------------------------------------------------------
def parse_steps(text: str, n_steps: int) -> tuple[int, int]:
    """`A:B` -> [A, B); an empty side means the log's first / last step. ConfigError names --steps."""
    a, sep, b = text.partition(":")
    try:
        lo = int(a) if a.strip() else 0
        hi = int(b) if b.strip() else n_steps
    except ValueError:
        raise ConfigError(f"--steps: expected A:B (steps A..B-1), got {text!r}") from None
    if not sep or not 0 <= lo < hi <= n_steps:
        raise ConfigError(f"--steps {text}: need 0 <= A < B <= {n_steps} (the log holds steps 0..{n_steps - 1})")
    return lo, hi


def default_segment(checkpoints: list[int]) -> int:
    """The run's most common checkpoint spacing (segments then start on checkpoints), else DEFAULT_SEGMENT."""
    gaps = Counter(b - a for a, b in zip([0, *checkpoints], checkpoints) if b > a)
    return gaps.most_common(1)[0][0] if gaps else DEFAULT_SEGMENT


def plan_segments(first: int, end: int, k: int, checkpoints: list[int]) -> list[tuple[int, int]]:
    """[first, end) in segments of at most k steps that start on checkpoints wherever the spacing allows.

    Whole checkpoint intervals are joined while the segment stays within k steps; an interval longer than k
    is cut into near-equal pieces (the first on its checkpoint; the others replay from it first)."""
    if k < 1:
        raise ConfigError(f"--segment {k}: must be >= 1")
    bounds = [first, *sorted({c for c in checkpoints if first < c < end}), end]
    out, cur = [], first
    for a, b in zip(bounds, bounds[1:]):
        if b - a > k:
            if cur < a:
                out.append((cur, a))
            n = -(-(b - a) // k)
            cuts = [a + (b - a) * i // n for i in range(n + 1)]
            out.extend(zip(cuts, cuts[1:]))
            cur = b
        elif b - cur > k:
            out.append((cur, a))
            cur = a
    if cur < end:
        out.append((cur, end))
    return out


def start_checkpoint(first: int, checkpoints: list[int]) -> int:
    """The state a segment's replay starts from: the latest checkpoint <= first (0: init)."""
    return max([c for c in checkpoints if c <= first], default=0)


# -- the auditor (one Ray actor per slot of the pool) ------------------------------------------------------
def detect_kind(device: str) -> str:
    """The hardware kind a certificate is filed under: cpu_x86, cpu_arm, gpu_nvidia (or cpu_<machine>)."""
    import torch

    if device.startswith("cuda"):
        return "gpu_amd" if getattr(torch.version, "hip", None) else "gpu_nvidia"
    m = platform.machine().lower()
    if m in ("x86_64", "amd64", "i386", "i686"):
        return "cpu_x86"
    if m in ("aarch64", "arm64") or m.startswith("arm"):
        return "cpu_arm"
    return f"cpu_{m}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts(device: str) -> dict:
    """What a certificate records about the machine that replayed."""
    import torch

    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else _cpu_name()
    return {"device": device, "device_name": name, "torch_version": torch.__version__,
            "cpu_isa": f"{platform.machine()}/{torch.backends.cpu.get_cpu_capability()}",
            "hostname": socket.gethostname()}


class Auditor:
    """A Ray Data callable class: each input row is a segment, each output row its certificate."""

    def __init__(self, device: str = "cpu", threads: int = 1, kind_override: str | None = None,
                 corpus: str | None = None) -> None:
        import torch

        torch.set_num_threads(max(1, threads))  # one auditor per requested CPU slot: no oversubscription
        self.device, self.corpus = device, corpus
        self.facts = machine_facts(device)
        self.kind = kind_override or detect_kind(device)
        self.kind_source = "override" if kind_override else "detected"
        self._logs: dict[tuple, RunLog] = {}

    def _log(self, run: str) -> RunLog:
        """The run's log, parsed once per actor while the file is unchanged (a long log is large)."""
        st = (Path(run) / "hashlog.jsonl").stat()
        key = (run, st.st_mtime_ns, st.st_size)
        if key not in self._logs:
            self._logs = {key: RunLog(run)}
        return self._logs[key]

    def __call__(self, batch: dict) -> pa.Table:
        rows = [self.audit(str(run), int(a), int(b), str(job))
                for run, a, b, job in zip(batch["run"], batch["first"], batch["end"], batch["job_id"])]
        return pa.Table.from_pylist(rows, schema=SCHEMA)

    def audit(self, run: str, first: int, end: int, job_id: str) -> dict:
        """Replay [first, end) and return its certificate (certificate_row)."""
        return certificate_row(run, first, end, job_id, self._log(run), self.device, self.kind, self.kind_source,
                               self.facts, self.corpus)


def certificate_row(run: str | Path, first: int, end: int, job_id: str, log: RunLog, device: str, kind: str,
                    kind_source: str, facts: dict, corpus: str | None = None) -> dict:
    """Replay [first, end) of `run` on this process's `device` (reading `corpus`, else rundesc.find_corpus's) and
    return its certificate (a row of SCHEMA); a refused input (AppError) is a REFUSED certificate. The auditor's
    work, callable without Ray."""
    from replay.core import replay_segment

    row = {"job_id": job_id, "run_hash": log.run_hash, "first_step": first, "end_step": end,
           "start_checkpoint": start_checkpoint(first, list_checkpoints(run)),
           "log_digest": log.segment_digest(first, end), "expected_chain": log.chain(end - 1),
           "computed_chain": "", "mismatch_step": None, "mismatch_stage": None, "mismatch_detail": None,
           "steps_replayed": 0, "kind": kind, "kind_source": kind_source, "backend": "", **facts}
    t0 = time.perf_counter()
    try:
        r = replay_segment(run, first, end, device=device, corpus=corpus)
    except AppError as e:  # bad digests, a non-deterministic run: recorded, certifies nothing
        row.update(verdict="REFUSED", mismatch_detail=f"{type(e).__name__}: {e}")
    else:
        row.update(verdict=r.verdict, expected_chain=r.expected_chain, computed_chain=r.computed_chain,
                   steps_replayed=r.steps_replayed, backend=r.backend, device=r.device,
                   start_checkpoint=getattr(r, "start_step", row["start_checkpoint"]))
        if r.mismatch is not None:
            row.update(mismatch_step=r.mismatch.step, mismatch_stage=r.mismatch.stage,
                       mismatch_detail=r.mismatch.detail)
    row.update(seconds=time.perf_counter() - t0, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return row


# -- resources and the Ray connection -----------------------------------------------------------------------
def auditor_resources(device: str, kind: str | None, resources: str | dict | None,
                      cluster: dict[str, float]) -> dict:
    """Per-auditor Ray resources {num_cpus, num_gpus, resources}, checked against what the cluster has.

    Default: one CPU (cpu) or one GPU (cuda); `kind` adds {kind: 1} (nodes advertising that custom
    resource, e.g. cpu_x86 / cpu_arm); `resources` (JSON) replaces it all. A request the cluster cannot
    meet is refused here instead of waiting forever."""
    if resources is not None:
        try:
            req = json.loads(resources) if isinstance(resources, str) else dict(resources)
            assert isinstance(req, dict) and all(isinstance(v, (int, float)) and v >= 0 for v in req.values())
        except (json.JSONDecodeError, AssertionError, TypeError, ValueError):
            raise ConfigError(f"--resources: expected a JSON object of non-negative numbers, e.g. "
                              f'{{"cpu_x86": 1}} or {{"num_gpus": 1}}; got {resources!r}') from None
    else:
        req = {"num_gpus": 1} if device.startswith("cuda") else {}
        if kind:
            req[kind] = 1
    out = {"num_cpus": float(req.pop("num_cpus", 1)), "num_gpus": float(req.pop("num_gpus", 0)),
           "resources": {k: float(v) for k, v in req.items()}}
    need = {"CPU": out["num_cpus"], "GPU": out["num_gpus"], **out["resources"]}
    for name, amount in need.items():
        if amount > cluster.get(name, 0):
            have = {k: v for k, v in cluster.items() if not k.startswith(("node:", "memory", "object_store"))}
            raise ConfigError(f"auditor resources: {name}={amount:g} per auditor, but the Ray cluster has "
                              f"{cluster.get(name, 0):g} ({have})")
    return out


def pool_size(req: dict, cluster: dict[str, float], segments: int) -> int:
    """How many auditors fit the cluster at once (at most one per segment)."""
    need = {"CPU": req["num_cpus"], "GPU": req["num_gpus"], **req["resources"]}
    fits = [int(cluster.get(k, 0) // v) for k, v in need.items() if v > 0]
    return max(1, min([segments, *fits]))


def connect(address: str | None, num_cpus: int | None) -> bool:
    """Use the running Ray (this driver's, `address`, or $RAY_ADDRESS), else start a local one; True if started."""
    import ray

    if ray.is_initialized():
        return False
    token_auth()
    address = address or os.environ.get("RAY_ADDRESS")  # what `ray job submit` sets for its driver
    if address:
        ray.init(address=address, log_to_driver=False)
        return False
    # "local": a new instance even where `ray start` (or a test's simulated cluster) left an address behind
    ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, log_to_driver=False)
    return True


# -- the job ---------------------------------------------------------------------------------------------------
@dataclass
class BatchOutcome:
    job_id: str
    path: Path
    rows: list[dict]
    segments: list[tuple[int, int]]  # the segments audited (with a sample: the drawn ones)
    sample: Sample | None = None


def new_job_id() -> str:
    """UTC time first (files sort by when the job ran), then a random suffix (jobs on several machines)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


@dataclass(frozen=True)
class BatchOptions:
    """What a batch audit covers and where its auditors run."""
    steps: str = ":"  # A:B audits steps A..B-1 (":" every logged step)
    segment: int | None = None  # steps per segment (None: the run's checkpoint spacing)
    address: str | None = None  # Ray cluster address (None: start a local Ray instance)
    device: str = "cpu"  # cuda: one GPU per auditor
    resources: str | dict | None = None  # per-auditor Ray resources (JSON or a dict), replacing the default
    kind: str | None = None  # run auditors only where the cluster advertises this custom resource
    kind_override: str | None = None  # tests: simulate another hardware kind
    num_cpus: int | None = None  # CPUs of a local Ray instance (None: all)
    progress: bool = True
    corpus: str | None = None  # read this copy of the corpus (None: replay.rundesc.find_corpus)
    sample: float | None = None  # audit only this fraction of the segments, drawn by `seed` (None: all of them)
    seed: int | None = None

    def __post_init__(self) -> None:
        if (self.sample is None) != (self.seed is None):
            raise ConfigError("--sample FRACTION and --seed S go together: the seed makes the draw reproducible "
                              "(give both, or neither to audit every segment)")
        if self.sample is not None:
            check_fraction(self.sample)
            check_seed(self.seed)


def run_batch(run: str | Path, opts: BatchOptions = BatchOptions(), console=None) -> BatchOutcome:
    """Audit `opts.steps` of `run` on Ray Data and write the job's certificates; returns them."""
    import ray
    from rich.console import Console

    console = console or Console(soft_wrap=True)
    run = Path(run).resolve()
    log = RunLog(run)
    first, end = parse_steps(opts.steps, log.n_steps)
    checkpoints = list_checkpoints(run)
    k = opts.segment if opts.segment is not None else default_segment(checkpoints)
    segs = plan_segments(first, end, k, checkpoints)
    sample = draw(segs, opts.sample, opts.seed, log.run_hash) if opts.sample is not None else None
    segs = list(sample.drawn) if sample else segs
    unaligned = [(a, b) for a, b in segs if a not in checkpoints and a != 0]
    if unaligned:
        warm = sum(a - start_checkpoint(a, checkpoints) for a, _ in unaligned)
        console.print(f"[yellow]note:[/] {len(unaligned)} of {len(segs)} segment(s) start where the run has no "
                      f"checkpoint (first: step {unaligned[0][0]}); their auditors replay {warm} warm-up step(s) "
                      f"from earlier checkpoints that these certificates do not cover")
    job_id = new_job_id()
    started = connect(opts.address, opts.num_cpus)
    try:
        cluster = ray.cluster_resources()
        req = auditor_resources(opts.device, opts.kind, opts.resources, cluster)
        rows = _execute(run, segs, job_id, opts, req, pool_size(req, cluster, len(segs)), console)
    finally:
        if started:
            ray.shutdown()
    path = write_certificates(run, job_id, rows, sample)
    return BatchOutcome(job_id, path, rows, segs, sample)


def _execute(run: Path, segs: list[tuple[int, int]], job_id: str, opts: BatchOptions, req: dict, pool: int,
             console) -> list[dict]:
    import ray.data
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # ours below counts segments; Ray's would count blocks
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # per-dataset INFO lines would break up the table
    items = [{"run": str(run), "first": a, "end": b, "job_id": job_id} for a, b in segs]
    ds = ray.data.from_items(items, override_num_blocks=len(items))  # one block per segment: all can start
    # the pool starts at one auditor and grows to as many as the requested resources fit
    strategy = ray.data.ActorPoolStrategy(min_size=1, max_size=pool)
    # max_restarts=0: Ray Data would have Ray restart a lost auditor (its default, -1), but it hands every pool actor
    # its context and transformer by object-store reference, and Ray cannot promise a restart whose constructor
    # arguments live there (it logs an ERROR at each job's first auditor saying so). A lost auditor (a node gone)
    # ends the job with Ray's error instead; run it again (coverage merges jobs: `--steps A:B` covers what is missing).
    # Ray 2.60 takes max_restarts only among the extra remote args it has deprecated (to go in 2.64, where this call
    # would fail loudly with a TypeError): that one deprecation notice is not shown.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated", category=DeprecationWarning)
        ds = ds.map_batches(Auditor, batch_size=1, compute=strategy, num_cpus=req["num_cpus"],
                            num_gpus=req["num_gpus"], resources=req["resources"] or None, max_restarts=0,
                            fn_constructor_kwargs={"device": opts.device, "threads": int(req["num_cpus"]) or 1,
                                                   "kind_override": opts.kind_override,
                                                   "corpus": opts.corpus and str(Path(opts.corpus).resolve())})
    rows: list[dict] = []
    cols = (TextColumn("[bold]audit {task.fields[job]}"), MofNCompleteColumn(), TextColumn("segments"), BarColumn(),
            TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
    with Progress(*cols, console=console, disable=not opts.progress) as bar:
        task = bar.add_task("audit", total=len(segs), job=job_id, info="")
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            for r in batch.to_pylist():
                rows.append(r)
                bad = sum(x["verdict"] != "MATCH" for x in rows)
                bar.update(task, advance=1, info=f"last {r['first_step']}..{r['end_step'] - 1} {r['verdict']} "
                                                 f"on {r['kind']}" + (f"  [red]{bad} not MATCH[/]" if bad else ""))
    return sorted(rows, key=lambda r: r["first_step"])


def batch_main(run: str, opts: BatchOptions) -> int:
    """`python -m app audit batch`: certificates, the merged coverage table and map; exit 0/1/2 (see docs)."""
    from rich.console import Console

    from replay.coverage import coverage_of, draw_coverage, print_coverage

    console = Console(soft_wrap=True)
    out = run_batch(run, opts, console)
    verdicts = Counter(r["verdict"] for r in out.rows)
    drawn = f" drawn from {len(out.sample.population)} (seed {out.sample.seed})" if out.sample else ""
    console.print(f"job {out.job_id}: {len(out.rows)} segment(s){drawn}, " +
                  ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())) + f"; certificates {out.path}")
    cov = coverage_of(run)  # its table lists this job's refused segments (and any earlier job's) apart
    print_coverage(cov, console)
    console.print(f"coverage map: {draw_coverage(cov)}")
    if verdicts["MISMATCH"] or cov.verdict.startswith("FAILED"):
        return 1
    return 2 if verdicts["REFUSED"] else 0
