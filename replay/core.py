"""Single-device replay of a run's steps (report section 6, algorithm 1): the trainer's own step function on
each step's recorded (virtual) topology, every stage digest, state hash and chain hash compared with the log.

`replay_segment(run, first, end)` starts from the latest checkpoint at or before `first` (verified: files,
digests, state hash, and its agreement with the log) or from the initialization (recomputed from config and
seed, checked against the init record), replays through step end-1 and stops at the first divergence.
Within a step, the log's fields are compared in computation order, so the first differing one names the
stage: forward (window range, forward digest), loss (loss, ce, z), backward, reduce (reduced digest), clip
(grad_norm, clip_coef, clipped digest), optimizer (lr, skipped, spike_trigger, optimizer digest), state
(the state hash differs while every stage agrees: counters, stream state, an edited log) and chain.
Where the run kept a checkpoint of the state after the diverged step, the detail names the first differing
tensor element with both values.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import stream
from kernels.digest import digest_many
from training import checkpoint as ckpt, devices, rundir
from training.config import RunConfig, Topology, identity_json
from training.errors import AppError, CheckpointError, RunDirError
from training.init import init_params
from training.rundir import CONFIG, HASHLOG, read_jsonl
from training.state_hash import ZERO, chain, code_version, state_entries, state_hash
from training.step import StepContext, StepResult, TrainState, run_step
from replay.diff import first_in
from replay.errors import AuditRefused
from replay.rundesc import check_collectives, check_copies, check_corpus, find_corpus

STAGES = ("init", "forward", "loss", "backward", "reduce", "clip", "optimizer", "state", "chain")
# hash-log fields per stage, in computation order (digest keys are the log's `digests` names)
_FIELDS = (("forward", ("windows",), ("forward",)), ("loss", ("loss", "ce", "z"), ()),
           ("backward", (), ("backward",)), ("reduce", (), ("reduced",)),
           ("clip", ("grad_norm", "clip_coef"), ("clipped",)),
           ("optimizer", ("lr", "skipped", "spike_trigger"), ("optimizer",)))


@dataclass
class Mismatch:
    """The first divergence: step, stage (STAGES) and a sentence saying what differs."""

    step: int
    stage: str
    detail: str


@dataclass
class ReplayResult:
    run_hash: str  # the log's final chain hash (the run's identity)
    first_step: int  # first step certified (inclusive)
    end_step: int  # exclusive
    verdict: str  # "MATCH" | "MISMATCH"
    mismatch: Mismatch | None
    expected_chain: str  # the log's chain hash after end_step - 1
    computed_chain: str  # the replay's ("" if it stopped early)
    steps_replayed: int  # including steps before first_step replayed from the start checkpoint
    device: str
    backend: str
    seconds: float
    start_step: int = 0  # the step the replay started at (a checkpoint's step, or 0 from the initialization)
    notes: list[str] = field(default_factory=list)  # what the auditor should know (e.g. a corpus copy's changes)


@dataclass
class _Run:
    """A run directory read and checked for replay (nothing unpickled, every file digest checked)."""

    path: Path
    cfg: RunConfig
    identity: str  # the config as the state hash carries it (training.config.identity_json)
    records: dict[int, dict]
    code: str
    stream: stream.WindowStream
    ident: str  # the manifest digest the stream state is hashed under (the run's)
    notes: list[str]

    def stream_state(self, step: int, batch: stream.BatchSchedule) -> dict:
        st = self.stream.state_for_step(step, batch)
        st["stream"]["manifest"] = self.ident  # the run's corpus identity (rundesc doc, step 3)
        return st


def open_run(run: str | Path, corpus: str | Path | None = None, steps: tuple[int, int] | None = None) -> _Run:
    """Read and check a run directory for replay (rundesc's order of checks); AuditRefused names what failed.

    `steps` [first, end): refused first, before the run's files are checked, unless the log holds them all."""
    path = Path(run)
    if not (path / CONFIG).is_file() or not (path / HASHLOG).is_file():
        raise AuditRefused(f"{path}: not a run directory (needs {CONFIG} and {HASHLOG})")
    records = read_jsonl(path / HASHLOG)
    if steps is not None and not 0 <= steps[0] < steps[1] <= len(records) - 1:
        held = f"steps 0..{len(records) - 2}" if len(records) > 1 else "no steps"
        raise AuditRefused(f"{path / HASHLOG}: holds {held}; steps {steps[0]}..{steps[1] - 1} were asked (the last "
                           f"step replayed must be logged, and not before the first)")
    try:
        desc = rundir.read_run_json(path)
        cfg, _ = rundir.read_config(path)
    except RunDirError as e:
        raise AuditRefused(str(e)) from None
    check_collectives(path, desc, records)
    if desc is not None:
        check_copies(path, desc)
    by_step = {r["step"]: r for r in records}
    if sorted(by_step) != list(range(-1, len(records) - 1)):
        raise AuditRefused(f"{path / HASHLOG}: expected records of steps -1, 0, 1, ... in order")
    code = code_version()
    if by_step[-1].get("code_version") != code:
        raise AuditRefused(f"{path / HASHLOG}: recorded by code version {by_step[-1].get('code_version')}, "
                           f"this is {code}; audit with the code the run was trained with")
    corpus_dir = find_corpus(path, desc, cfg.train.corpus, corpus)
    ident, notes = check_corpus(path, desc, corpus_dir, explicit=corpus is not None)
    try:
        s = stream.open_stream(corpus_dir, seq_len=cfg.model.seq_len, seed=cfg.train.seed)
    except stream.StreamError as e:  # a shard or tokenizer that does not match its manifest: names the file
        raise AuditRefused(f"corpus {corpus_dir}: {e}") from None
    return _Run(path, cfg, cfg.identity_json(), by_step, code, s, ident or s.manifest.digest, notes)


def replay_step(state: TrainState, r: _Run, ctx: StepContext, topology: Topology,
                prev: bytes) -> tuple[StepResult, bytes, bytes]:
    """Trainer.one_step's computation (app's functions, nothing re-implemented): (result, state, chain)."""
    step = state.step
    lo, hi = ctx.batch.window_range(step)
    tokens = torch.from_numpy(r.stream.windows(lo, hi)).to(torch.int64).to(ctx.device)
    res = run_step(state, tokens, topology, ctx)
    sdig = state_hash(state_entries(state, r.identity, r.code, r.stream_state(step + 1, ctx.batch)), res.memo)
    return res, sdig, chain(prev, sdig)


def _logged(rec: dict, res: StepResult, name: str):
    return list(res.windows) if name == "windows" else {"skipped": not res.applied,
                                                         "spike_trigger": res.triggered}.get(name, getattr(res, name, None))


def _stage_of(rec: dict, res: StepResult, run: Path) -> tuple[str, str] | None:
    """(stage, what differs) for the first of the step's logged fields the replay does not reproduce."""
    for stage, names, digests in _FIELDS:
        for n in names:
            if n in rec and rec[n] != _logged(rec, res, n):
                return stage, f"{n}: logged {rec[n]!r}, replay {_logged(rec, res, n)!r}"
        for d in digests:
            want = rec.get("digests", {}).get(d)
            if want is not None and want != res.digests.get(d):
                extra = ""
                if stage == "forward":
                    extra = (f"; step loss logged {rec.get('loss')!r}, replay {res.loss!r} (windows "
                             f"[{res.windows[0]}, {res.windows[1]}): `python -m app data inspect --run {run} --step {res.step}` "
                             f"names their documents)")
                return stage, f"{d} digest: logged {want}, replay {res.digests.get(d)}{extra}"
    return None


def _tensor_detail(r: _Run, ctx: StepContext, step: int, stage: str, rec: dict, res: StepResult,
                   state: TrainState) -> str:
    """The first differing element against the run's checkpoint of the state after `step`, where one exists."""
    path = rundir.ckpt_dir(r.path, step + 1)
    if stage not in ("reduce", "clip", "optimizer", "state") or not path.is_dir():
        return ""
    try:
        want, manifest = ckpt.load_checkpoint(path, ctx.specs, r.code, "cpu")
    except AppError as e:
        return f"; checkpoint {path.name} cannot serve as the expected state ({e})"
    if stage == "reduce" and not (rec.get("clip_coef") == 1.0 and res.clip_coef == 1.0):
        return ""  # the checkpoint holds post-clip gradients: equal to the reduced ones only without clipping
    groups = [("grad", want.grads, state.grads)]
    if stage in ("optimizer", "state"):
        groups += [("param", want.params, state.params), ("m", want.m, state.m), ("v", want.v, state.v)]
    for prefix, e, a in groups:
        if (d := first_in(prefix, e, a)) is not None:
            return f"; against checkpoint {path.name}: {d}"
    if stage == "state":
        counters = {"adam_step": want.adam_step, "step": want.step, "tokens": want.tokens, "spike": want.spike}
        mine = {"adam_step": state.adam_step, "step": state.step, "tokens": state.tokens, "spike": state.spike}
        for k in counters:
            if counters[k] != mine[k]:
                return f"; against checkpoint {path.name}: {k} {counters[k]!r}, replay {mine[k]!r}"
        theirs = dict(manifest["stream_state"], stream={**manifest["stream_state"]["stream"], "manifest": r.ident})
        mine = r.stream_state(step + 1, ctx.batch)
        if theirs != mine:
            keys = sorted(k for k in set(theirs) | set(mine) if theirs.get(k) != mine.get(k))
            return (f"; against checkpoint {path.name}: stream state differs in {keys} (checkpoint "
                    f"{ {k: theirs.get(k) for k in keys} }, replay { {k: mine.get(k) for k in keys} })")
        if manifest["state_hash"] == rec.get("state_hash"):
            return f"; checkpoint {path.name} agrees with the log, the replay's stream state or metadata differs"
        return (f"; the replay's tensors and counters equal checkpoint {path.name}'s, whose manifest state hash is "
                f"{manifest['state_hash']}: the log's record differs from the run's own checkpoint (edited log?)")
    return f"; every tensor equals checkpoint {path.name}'s"


def _compare(r: _Run, ctx: StepContext, rec: dict, res: StepResult, sdig: bytes, chn: bytes,
             state: TrainState) -> Mismatch | None:
    step = res.step
    found = _stage_of(rec, res, r.path)
    if found is None and rec.get("tokens") != state.tokens:
        found = ("state", f"tokens: logged {rec.get('tokens')!r}, replay {state.tokens!r}")
    if found is None and rec.get("state_hash") != sdig.hex():
        found = ("state", f"state hash: logged {rec.get('state_hash')}, replay {sdig.hex()} (every stage digest "
                          f"matches)")
    if found is None and rec.get("chain_hash") != chn.hex():
        return Mismatch(step, "chain", f"chain hash: logged {rec.get('chain_hash')}, replay {chn.hex()} (the state "
                                       f"hash matches)")
    if found is None:
        return None
    stage, what = found
    return Mismatch(step, stage, f"step {step} ({rec.get('topology')}), {what}"
                    + _tensor_detail(r, ctx, step, stage, rec, res, state))


def _start(r: _Run, ctx: StepContext, first_step: int, device: str) -> tuple[TrainState, bytes, Mismatch | None]:
    """The replay's start: the latest checkpoint at or before `first_step`, else the initialization."""
    cps = [c for c in rundir.list_checkpoints(r.path) if 0 < c <= first_step]
    if cps:
        path = rundir.ckpt_dir(r.path, cps[-1])
        state, manifest = ckpt.load_checkpoint(path, ctx.specs, r.code, device)  # refuses a bad file, naming it
        if identity_json(manifest["config"]) != r.identity:
            raise CheckpointError(f"{path / ckpt.MANIFEST}: another run's config")
        st = dict(manifest["stream_state"])
        st["stream"] = {**st["stream"], "manifest": r.stream.manifest.digest}  # read from the corpus given
        try:
            r.stream.restore(st)
        except stream.StreamError as e:
            raise AuditRefused(f"{path / ckpt.MANIFEST}: stream state does not fit the corpus ({e})") from None
        if (key := rundir.disagreement(r.records, state.step, manifest)) is not None:
            logged = r.records[state.step - 1].get(key)
            stage = {"state_hash": "state", "chain_hash": "chain"}[key]
            return state, b"", Mismatch(state.step - 1, stage, f"checkpoint {path.name} has {key} {manifest[key]}, "
                                                               f"the log's record of step {state.step - 1} {logged}")
        return state, bytes.fromhex(manifest["chain_hash"]), None
    rec = r.records[-1]
    params = init_params(r.cfg.model, r.cfg.train.seed, ctx.device)
    state = TrainState.fresh(params)
    if rec.get("init_digest") != (d := digest_many(params)):
        return state, b"", Mismatch(-1, "init", f"init parameters digest: logged {rec.get('init_digest')}, replay {d} "
                                               f"(from config seed {r.cfg.train.seed})")
    sdig = state_hash(state_entries(state, r.identity, r.code, r.stream_state(0, ctx.batch)))
    if rec.get("state_hash") != sdig.hex():
        return state, b"", Mismatch(-1, "init", f"initial state hash: logged {rec.get('state_hash')}, replay "
                                               f"{sdig.hex()} (parameters match: config, code or corpus identity)")
    prev = chain(ZERO, sdig)
    if rec.get("chain_hash") != prev.hex():
        return state, b"", Mismatch(-1, "chain", f"initial chain hash: logged {rec.get('chain_hash')}, replay "
                                                f"{prev.hex()}")
    return state, prev, None


def replay_segment(run: str | Path, first_step: int, end_step: int, device: str = "cpu", progress: bool = False,
                   corpus: str | Path | None = None, backend: str = "ref") -> ReplayResult:
    """Replay steps [first_step, end_step) of `run` on one device and compare with its log (module doc)."""
    t0 = time.perf_counter()
    r = open_run(run, corpus, (first_step, end_step))
    last = len(r.records) - 1  # steps 0 .. last-1 are logged
    devices.check(device, backend)
    ctx = StepContext.build(r.cfg, device, backend)
    state, prev, mm = _start(r, ctx, first_step, device)
    start = state.step
    n = 0
    if mm is None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        with Progress(TextColumn("[bold]replay"), MofNCompleteColumn(), BarColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[info]}"), disable=not progress) as bar:
            task = bar.add_task("replay", total=end_step - start, info="")
            while state.step < end_step:
                rec = r.records[state.step]
                res, sdig, prev = replay_step(state, r, ctx, Topology.parse(rec["topology"]), prev)
                n += 1
                if (mm := _compare(r, ctx, rec, res, sdig, prev, state)) is not None:
                    break
                bar.update(task, advance=1, info=f"step {res.step}  chain {prev.hex()[:12]}  MATCH")
    return ReplayResult(r.records[last - 1]["chain_hash"], first_step, end_step, "MISMATCH" if mm else "MATCH", mm,
                        r.records[end_step - 1]["chain_hash"], "" if mm else prev.hex(), n, str(ctx.device),
                        f"{backend} (torch {torch.__version__})", time.perf_counter() - t0, start, r.notes)
