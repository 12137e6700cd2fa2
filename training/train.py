"""The single-process trainer: run directory, stream, steps, hash chain, held-out eval, checkpoints, plots.

A run directory holds config.json, hashlog.jsonl (one record per step, the init record first: step -1),
metrics.jsonl (timings, held-out CE, weight norms, events), checkpoints/ and loss.png. It is never
overwritten: a new run needs a fresh directory, `resume` continues an existing one from its latest
checkpoint. Steps logged after that checkpoint (a run that went on, or crashed, past it) are recomputed
and each checked against its recorded chain hash (DivergenceError on the first difference); the log as
it was is kept aside as hashlog.before-resume-<n>.jsonl.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import stream
from kernels.digest import digest_many
from training import checkpoint as ckpt, devices, rundir
from training.config import RunConfig, Topology
from training.deferred_hash import QueuedHash, StateHashReader, queue_state_hash
from training.errors import AppError, ConfigError, DivergenceError, IntegrityError, RunDirError
from training.evaluate import heldout_ce, heldout_tokens, weight_norms
from training.init import init_params
from training.rundir import HASHLOG, METRICS, JsonlLog, read_jsonl
from training.state_hash import ZERO, canonical_json, chain, code_version, state_entries, state_hash
from training.step import StepContext, StepResult, TrainState, run_step

@dataclass(frozen=True)
class TrainOptions:
    """How a run is trained, as against what it computes (RunConfig): none of these changes a bit of the log."""
    steps: int  # train until this many steps are done
    checkpoint_every: int = 100  # steps between checkpoints (0: only the last)
    eval_every: int = 50  # steps between held-out evaluations (0: none)
    topology: Topology = Topology()  # the virtual data-parallel mesh of a one-process run
    device: str = "cpu"
    progress: bool = True
    backend: str = "ref"  # kernels.backend: "triton" runs the Triton twins on CUDA; the bits are the same
    threads: int = 0  # torch CPU threads (0: torch's default)

    def __post_init__(self) -> None:
        for flag, value, least in (("--steps", self.steps, 1), ("--checkpoint-every", self.checkpoint_every, 0),
                                   ("--eval-every", self.eval_every, 0), ("--threads", self.threads, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"{flag}: expected an int >= {least}, got {value!r}")


def _record(r: StepResult, tokens: int, state_digest: bytes, chain_digest: bytes) -> dict:
    """The hash-log record of a step: only values that are functions of config, corpus and code."""
    return {"step": r.step, "tokens": tokens, "windows": list(r.windows), "topology": r.topology, "accum": r.accum,
            "loss": r.loss, "ce": r.ce, "z": r.z, "grad_norm": r.grad_norm, "clip_coef": r.clip_coef, "lr": r.lr,
            "skipped": not r.applied, "spike_trigger": r.triggered, "state_hash": state_digest.hex(),
            "chain_hash": chain_digest.hex(), "digests": r.digests, **({"expert_load": r.expert_load}
                                                                     if r.expert_load else {})}


@dataclass
class _Queued:
    """A step that ran, with its state hash queued and not yet read (Trainer.start_step)."""
    result: StepResult
    tokens: int  # the state's token count after the step
    n_tokens: int  # the step's tokens
    started: float  # perf_counter() at the step's start
    ran: float  # ... when run_step returned
    hashing: QueuedHash | None = None  # its state hash, queued (None: a rank that does not write the run)
    queue_seconds: float = 0.0  # host time spent queueing them


class _NullLog:
    """The log of a process that does not write the run directory (a data-parallel rank other than 0)."""

    def append(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


class Trainer:
    """One run: `Trainer(cfg, out, opts, resume).run()`.

    `group` (training/ray_train.py): a real data-parallel group every rank's Trainer shares; each step then runs
    only this rank's microbatches (training/step.py). `writer`: whether this process writes the run directory
    (hash log, metrics, checkpoints); the other ranks only read it (their checkpoint on resume).
    """

    def __init__(self, cfg: RunConfig, out: str | Path, opts: TrainOptions, resume: bool = False,
                 group=None, writer: bool = True) -> None:
        self.cfg, self.out, self.opts = cfg, Path(out), opts
        self.group, self.writer = group, writer
        self.code = code_version()
        self.config_json = canonical_json(cfg.to_dict()).decode()  # config.json, as given
        self.identity = cfg.identity_json()  # what the state hash carries (no corpus path)
        devices.check(opts.device, opts.backend)
        self.ctx = StepContext.build(cfg, opts.device, opts.backend)
        # everything that can refuse the config is checked before the run directory is touched
        self.stream = stream.open_stream(cfg.train.corpus, seq_len=cfg.model.seq_len, seed=cfg.train.seed)
        vocab = self.stream.manifest.vocab_size
        if vocab != cfg.model.vocab_size:
            raise ConfigError(f"model.vocab_size: {cfg.model.vocab_size}, but corpus {cfg.train.corpus} has a "
                              f"{vocab}-token tokenizer")
        self.heldout = heldout_tokens(cfg, self.ctx.device)
        self._check_steps()
        self._open_run_dir(resume)
        self.created = not resume  # this process made the run directory (discard_unstarted may remove it)
        self.metrics = JsonlLog(self.out / METRICS) if writer else _NullLog()
        self.expected: dict[int, dict] = {}
        self.state, self.prev = self._resume() if resume else self._fresh()
        self.log = JsonlLog(self.out / HASHLOG) if writer else _NullLog()
        self._reader = StateHashReader()

    # -- run directory, start, resume -------------------------------------------------------------------
    def _check_steps(self) -> None:
        t, end = self.cfg.train, self.ctx.batch.window_range(self.opts.steps - 1)[1]
        if t.heldout_windows and end > t.heldout_window:
            raise ConfigError(f"--steps {self.opts.steps}: would read windows up to {end}, past train.heldout_window="
                              f"{t.heldout_window} (the held-out slice); train fewer steps or move the slice")

    def discard_unstarted(self) -> None:
        """Remove the run directory this process created when no step was logged in it: a start refused at its
        first step (a topology the step cannot run, say) leaves nothing behind to refuse the next attempt."""
        if not (self.created and self.writer and self.state.step == 0):
            return
        self.log.close()
        self.metrics.close()
        shutil.rmtree(self.out, ignore_errors=True)

    def _open_run_dir(self, resume: bool) -> None:
        if not resume and not self.writer:
            raise RunDirError(f"{self.out}: a process that does not write the run directory can only resume it")
        if resume:
            rundir.check_resumable(self.out, self.cfg)
        else:
            rundir.create(self.out, self.config_json)

    def _fresh(self) -> tuple[TrainState, bytes]:
        rundir.write_run_json(self.out, self.config_json, self.code, self.stream.manifest, self.cfg.train.reduction)
        params = init_params(self.cfg.model, self.cfg.train.seed, self.ctx.device)
        state = TrainState.fresh(params)
        sdig = state_hash(state_entries(state, self.identity, self.code, self.stream.state(0)))
        prev = chain(ZERO, sdig)
        self.last_state_hash = sdig.hex()
        with JsonlLog(self.out / HASHLOG) as log:
            log.append({"step": -1, "tokens": 0, "init_digest": digest_many(params), "state_hash": sdig.hex(),
                        "chain_hash": prev.hex(), "code_version": self.code})
        self.metrics.append({"event": "start", "config": self.cfg.name, "topology": self.opts.topology.label(),
                             "device": str(self.ctx.device), "backend": self.ctx.backend,
                             "torch": torch.__version__, "code_version": self.code,
                             "time": time.time()})
        return state, prev

    def _resume(self) -> tuple[TrainState, bytes]:
        steps = rundir.list_checkpoints(self.out)
        if not steps:
            return self._restart()
        path = rundir.ckpt_dir(self.out, steps[-1])
        state, manifest = ckpt.load_checkpoint(path, self.ctx.specs, self.code, self.ctx.device)
        self.stream.restore(manifest["stream_state"])
        self.resumed_from = path
        self.last_state_hash = manifest["state_hash"]
        if not self.writer:  # the writer checks the log against the checkpoint and rewrites it
            return state, bytes.fromhex(manifest["chain_hash"])
        records = {r["step"]: r for r in read_jsonl(self.out / HASHLOG)}
        if (key := rundir.disagreement(records, state.step, manifest)) is not None:
            logged = records.get(state.step - 1, {}).get(key, "none")
            raise IntegrityError(self.out / HASHLOG, manifest[key], logged,
                                 f"the log's record of step {state.step - 1} does not match checkpoint {path.name}")
        self.expected = rundir.cut_log_at(self.out, state.step)  # steps logged after it: re-checked as they recur
        self.metrics.append({"event": "resume", "from_step": state.step, "checkpoint": str(path),
                             "recheck_steps": len(self.expected), "time": time.time()})
        return state, bytes.fromhex(manifest["chain_hash"])

    def _restart(self) -> tuple[TrainState, bytes]:
        """A run stopped before its first checkpoint: from the initialization, which its init record pins (config
        and seed give it again; the steps logged since are re-checked as they recur). A run stopped before its
        init record was written starts as a fresh one would."""
        records = read_jsonl(self.out / HASHLOG) if (self.out / HASHLOG).is_file() else []
        if not records or records[0].get("step") != -1:
            if not self.writer:
                raise RunDirError(f"{self.out}: no init record in {HASHLOG} yet; rank 0 starts the run")
            return self._fresh()
        params = init_params(self.cfg.model, self.cfg.train.seed, self.ctx.device)
        state = TrainState.fresh(params)
        sdig = state_hash(state_entries(state, self.identity, self.code, self.stream.state(0)))
        if sdig.hex() != records[0]["state_hash"]:
            raise IntegrityError(self.out / HASHLOG, records[0]["state_hash"], sdig.hex(),
                                 "the init record does not match this config's initialization")
        self.last_state_hash = sdig.hex()
        if self.writer:
            self.expected = rundir.cut_log_at(self.out, 0)
            self.metrics.append({"event": "resume", "from_step": 0, "checkpoint": None,
                                 "recheck_steps": len(self.expected), "time": time.time()})
        return state, chain(ZERO, sdig)

    # -- the loop -----------------------------------------------------------------------------------------
    def evaluate(self) -> dict:
        if not self.writer:
            return {}
        rec = {"event": "eval", "step": self.state.step, "tokens": self.state.tokens,
               "weight_norms": weight_norms(self.state.params, self.cfg)}
        if self.heldout is not None:
            rec["heldout_ce"] = heldout_ce(self.state.params, self.cfg, self.heldout, self.ctx.rope)
        self.metrics.append(rec)
        return rec

    def start_step(self) -> "_Queued":
        """Run the next step and queue its state hash's digests on the device, without reading them: on CUDA the
        host can go on to the next step while the GPU hashes, and `finish_step` reads the digests later."""
        step = self.state.step
        lo, hi = self.ctx.batch.window_range(step)
        t0 = time.perf_counter()
        tokens = torch.from_numpy(self.stream.windows(lo, hi)).to(torch.int64).to(self.ctx.device)
        r = run_step(self.state, tokens, self.opts.topology, self.ctx, self.group)
        if not self.writer:  # nothing to log; on HSDP this rank does not even hold the full state
            return _Queued(r, self.state.tokens, (hi - lo) * self.cfg.model.seq_len, t0, time.perf_counter())
        t1 = time.perf_counter()
        entries = state_entries(self.state, self.identity, self.code,
                                self.stream.state_for_step(step + 1, self.ctx.batch))
        queued = queue_state_hash(entries, r.memo)
        return _Queued(r, self.state.tokens, (hi - lo) * self.cfg.model.seq_len, t0, t1, queued,
                       time.perf_counter() - t1)

    def finish_step(self, q: "_Queued") -> tuple[dict, float, float]:
        """Read a started step's state hash, chain it, log its record and check it against an expected one;
        (record, step seconds, hashing seconds). Steps are finished in the order they were started. A rank that
        does not write the run directory only ran the step ({"step", "loss"})."""
        r = q.result
        if q.hashing is None:
            return {"step": r.step, "loss": r.loss}, q.ran - q.started, r.digest_seconds
        t2 = time.perf_counter()
        sdig = self._reader.read(q.hashing)
        self.prev = chain(self.prev, sdig)
        self.last_state_hash = sdig.hex()
        rec = _record(r, q.tokens, sdig, self.prev)
        self.log.append(rec)
        now = time.perf_counter()
        # a step's own seconds: running it and queueing its hash, then waiting for the hash and logging; not the
        # next step, which the loop runs in between while the device hashes (their sum is the loop's wall time)
        secs = (q.ran - q.started) + q.queue_seconds + (now - t2)
        want = self.expected.pop(r.step, None)
        if want is not None and want["chain_hash"] != rec["chain_hash"]:
            raise DivergenceError(f"step {r.step}: recomputed chain hash {rec['chain_hash']} differs from the logged "
                                  f"{want['chain_hash']} (state hash {rec['state_hash']} vs {want['state_hash']})")
        hashing = q.queue_seconds + (now - t2) + r.digest_seconds
        self.metrics.append({"event": "step", "step": r.step, "seconds": secs, "hash_seconds": hashing,
                             "tokens_per_s": q.n_tokens / secs})
        return rec, secs, hashing

    def one_step(self) -> tuple[dict, float, float]:
        """Run, hash and log the next step; (record, step seconds, hashing seconds)."""
        return self.finish_step(self.start_step())

    def checkpoint(self) -> Path | None:
        if not self.writer:
            return None
        path = ckpt.save_checkpoint(self.out, self.state, self.cfg.to_dict(), self.code,
                                    self.stream.state_for_step(self.state.step, self.ctx.batch),
                                    self.last_state_hash, self.prev.hex())
        self.metrics.append({"event": "checkpoint", "step": self.state.step, "path": str(path), "time": time.time()})
        return path

    def run(self) -> dict:
        """Train to `opts.steps` steps; returns the summary (also the last metrics event)."""
        from training.progress import StepProgress
        from training.report import plot_losses

        o = self.opts
        if self.state.step >= o.steps:
            raise ConfigError(f"--steps {o.steps}: the run is already at step {self.state.step}")
        first = self.state.step
        if first == 0 and o.eval_every:
            self.evaluate()
        total_s = hash_s = 0.0
        losses = []
        with StepProgress(o.steps, first, self.cfg.model.seq_len, enabled=o.progress) as bar:
            def finish(q: _Queued) -> None:
                nonlocal total_s, hash_s
                rec, secs, hs = self.finish_step(q)
                total_s, hash_s = total_s + secs, hash_s + hs
                losses.append(rec["loss"])
                if self.writer:
                    bar.update(rec, secs)

            pending = None  # the step before, started and not yet finished
            while self.state.step < o.steps:
                try:
                    q = self.start_step()
                except BaseException:
                    if pending is not None:  # log what was done before the failure
                        finish(pending)
                    raise
                if pending is not None:  # its digests were computed while this step was queued
                    finish(pending)
                pending = None
                n = self.state.step
                evaluate = bool(o.eval_every) and n % o.eval_every == 0
                save = bool(o.checkpoint_every) and n % o.checkpoint_every == 0
                if evaluate or save:
                    finish(q)  # evaluations and checkpoints follow the step's record
                    if evaluate:
                        self.evaluate()
                    if save:
                        self.checkpoint()
                else:
                    pending = q
            if pending is not None:
                finish(pending)
        if o.eval_every and self.state.step % o.eval_every:
            self.evaluate()
        if not o.checkpoint_every or self.state.step % o.checkpoint_every:
            self.checkpoint()  # the end state is always resumable
        if self.writer:
            plot_losses(self.out)
        evals = [r for r in read_jsonl(self.out / METRICS) if r.get("event") == "eval" and "heldout_ce" in r]
        summary = {"event": "end", "run": str(self.out), "steps": self.state.step, "tokens": self.state.tokens,
                   "first_loss": losses[0], "last_loss": losses[-1],
                   "heldout_first": evals[0]["heldout_ce"] if evals else None,
                   "heldout_last": evals[-1]["heldout_ce"] if evals else None,
                   "seconds": total_s, "hash_share": hash_s / total_s if total_s else 0.0,
                   "run_hash": self.prev.hex() if self.writer else None, "time": time.time()}
        self.metrics.append(summary)
        self.log.close()
        self.metrics.close()
        return summary


def train(cfg: RunConfig, out: str | Path, opts: TrainOptions, resume: bool = False) -> dict:
    """Train (or resume) the run at `out`; returns the summary dict."""
    t = Trainer(cfg, out, opts, resume)
    try:
        return t.run()
    except AppError:  # refused input: a new run that logged no step is removed, so the same command can be rerun
        t.discard_unstarted()
        raise


def main(cfg: RunConfig, out: str | Path, opts: TrainOptions, resume: bool = False) -> int:
    """`python -m app train ...`: train, print the one-line summary with the run hash."""
    from rich.console import Console

    if opts.threads:
        torch.set_num_threads(opts.threads)
    s = train(cfg, out, opts, resume)
    held = (f", held-out CE {s['heldout_first']:.3f} -> {s['heldout_last']:.3f}"
            if s["heldout_first"] is not None else "")
    Console(soft_wrap=True).print(
        f"run {s['run']}: {s['steps']} steps, {s['tokens']:,} tokens, loss {s['first_loss']:.3f} -> "
        f"{s['last_loss']:.3f}{held}, hashing {100 * s['hash_share']:.1f}% of step time, run hash {s['run_hash']}")
    return 0
