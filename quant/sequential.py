"""`python -m app quant run`: the sequential per-layer ARVQ pipeline (the ARVQ write-up, section 5) over a trained MoE.

Layers go in order. Two trajectories per calibration split ride along in a rolling cache: the student
(h after the published hybrid layers: each layer tuned against the drifted input it will see) and the
reference (the donor, untouched). Per requested layer: problem -> initial fit -> baselines -> PV (here,
or on a gang of Ray actors) -> gates -> export with serialized-replay check -> the next layer's
trajectories from the export's *reloaded bytes* -> cache file (atomic, blake3) -> publish (store.write_layer:
round trip verified, atomic, manifest is the commit point) -> reload and digest re-check. A crash anywhere
leaves every published layer intact; a rerun finds them in the manifest, takes the last one's cache
(its blake3 checked, or recomputes the trajectories through the published layers) and goes on from the
first unpublished layer. Events: OUT/run_log.jsonl, one JSON object per line.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import blake3
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from safetensors.torch import load as st_load, save as st_save

from kernels.digest import bits_equal, digest_many
from quant import calib, layer as L, store
from quant.donor import Donor, cold_from_load, load_donor
from quant.errors import ConfigError, IntegrityError
from quant.fit import FitConfig, config_dict
from quant.objective import SPLITS, row_weights
from quant.expert_sum import Reducer
from quant.experts import PROJS
from quant.pv import PVConfig, Tuner
from stream.fileio import atomic_write_bytes, check_safetensors_bytes

CACHE = "cache"


@dataclass(frozen=True)
class RunSpec:
    """What `quant run` does; everything that changes the published bits is here (and in the manifest)."""
    model: str
    out: str
    layers: tuple[int, ...] | None = None       # None: every MoE layer
    target: str = "reference"
    hot_per_layer: int = 1
    gang: int = 0                                # 0: tune in this process; N >= 1: N Ray actors
    boundary_weight: float = 1.0
    compare: bool = True
    pv: PVConfig = PVConfig()
    fit: FitConfig = FitConfig(sample_groups=4000)
    calib: calib.CalibConfig = calib.CalibConfig()
    crash: tuple[int, int, int] | None = None    # (layer, gang rank, update): fault injection for tests

    def fingerprint(self) -> dict:
        d = asdict(self)
        for k in ("out", "crash", "gang", "compare"):  # how it runs, not what it computes
            d.pop(k)
        return d


class _Log:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, event: str, **kw) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"t": round(time.time(), 3), "event": event, **kw}, default=_json) + "\n")


def _json(o):
    if isinstance(o, torch.Tensor):
        return o.tolist()
    return float(o)


def _save_cache(out: Path, layer: int, traj: dict) -> str:
    data = st_save({f"{s}/{k}": t.contiguous() for s, (hs, hr) in traj.items() for k, t in (("student", hs),
                                                                                              ("reference", hr))})
    (out / CACHE).mkdir(exist_ok=True)
    atomic_write_bytes(out / CACHE / f"after_{layer:04d}.safetensors", data)
    return blake3.blake3(data).hexdigest()


def _load_cache(out: Path, layer: int, digest: str) -> dict | None:
    path = out / CACHE / f"after_{layer:04d}.safetensors"
    if not path.exists():
        return None
    data = path.read_bytes()
    if blake3.blake3(data).hexdigest() != digest:
        return None  # stale or damaged: recompute through the published layers instead
    try:
        check_safetensors_bytes(data)  # the header's sizes fit the bytes before the parser allocates from them
    except ValueError:
        return None
    t = st_load(data)
    return {s: (t[f"{s}/student"], t[f"{s}/reference"]) for s in SPLITS}


def _inputs(donor, spec: RunSpec, data: dict | None) -> tuple[dict, dict, dict]:
    data = data if data is not None else donor.calibration(spec.calib)
    traj = {s: (donor.embed(data[s][:, :-1]),) * 2 for s in SPLITS}
    weights = {s: row_weights(data[s][:, 1:], donor.separator, spec.boundary_weight) for s in SPLITS}
    return traj, weights, data


def open_donor(model: str):
    """One of the project's run directories (it has checkpoints/) or a Hugging Face checkpoint directory (a
    config.json and no checkpoints/)."""
    path = Path(model)
    if not (path / "checkpoints").is_dir() and (path / "config.json").exists():
        from quant.hf_donor import load_hf_donor
        return load_hf_donor(model)
    return load_donor(model)


def donor_files(donor) -> dict[str, str]:
    """blake3 of each file the donor was read from (a Hugging Face checkpoint's; {} for a project run)."""
    ck = getattr(donor, "ck", None)
    return dict(ck.files) if ck is not None else {}


def advance(donor: Donor, layer: int, traj: dict, cold_w: dict | None, emulate: bool, rope) -> dict:
    """Both trajectories through one layer; cold_w None = the layer is not quantized (student = donor)."""
    out = {}
    for s, (hs, hr) in traj.items():
        hs2 = donor.block(layer, hs, rope) if cold_w is None else \
            L.student_step(donor, layer, hs, cold_w, emulate, rope)
        out[s] = (hs2, donor.block(layer, hr, rope))
    return out


def run(spec: RunSpec, console: Console | None = None, *, donor: Donor | None = None, data: dict | None = None,
        cold: dict[int, list[int]] | None = None) -> dict:
    """The pipeline; returns {layer: record}. Resumes from OUT's manifest. `donor`, `data` (calibration
    windows per split) and `cold` (experts per layer) replace what spec.model would give (tests)."""
    console = console or Console()
    donor = donor or open_donor(spec.model)   # a bad checkpoint is refused before OUT is touched
    out = Path(spec.out)
    out.mkdir(parents=True, exist_ok=True)
    log = _Log(out / "run_log.jsonl")
    n_layers = donor.n_layers
    layers = sorted(spec.layers) if spec.layers is not None else list(range(n_layers))
    if not layers or layers[0] < 0 or layers[-1] >= n_layers:
        raise ConfigError(f"--layers: the model has layers 0..{n_layers - 1}, got {layers}")
    traj0, weights, data = _inputs(donor, spec, data)
    cold = cold or cold_from_load(donor.routing_load(data), spec.hot_per_layer)
    manifest = store.read_manifest(out)
    fp = spec.fingerprint()
    for k, rec in manifest["layers"].items():
        if rec["meta"].get("spec") != json.loads(json.dumps(fp, default=_json)):
            raise ConfigError(f"{out / store.MANIFEST}: layer {k} was published by another spec; use a fresh --out")
    rope = donor.rope()
    log("start", spec=fp, gang=spec.gang, donor=donor.source, cold=cold)
    done = [x for x in layers if str(x) in manifest["layers"]]
    start, traj = 0, None
    if done:
        store.verify_files(out, manifest)  # a resumed run stands on every published file, cached trajectory or not
        last = done[-1]
        traj = _load_cache(out, last, manifest["layers"][str(last)]["meta"]["cache_blake3"])
        start = last + 1 if traj is not None else 0
        log("resume", published=done, from_cache=traj is not None)
    traj = traj if traj is not None else traj0
    stats = data.get("stats", {})
    records = {int(k): v["meta"] for k, v in manifest["layers"].items()}
    gang = None
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task("ARVQ layers", total=len(layers), completed=len([x for x in done if x < start]))
            for layer in range(start, layers[-1] + 1):
                if str(layer) in manifest["layers"]:     # published earlier: replay it from its files
                    traj = advance(donor, layer, traj, L.weights_of(store.load_layer(out, layer), cold[layer]),
                                   spec.pv.emulate, rope)
                    continue
                if layer not in layers:
                    traj = advance(donor, layer, traj, None, spec.pv.emulate, rope)
                    continue
                progress.update(task, description=f"layer {layer}: capture, fit, PV ({len(cold[layer])} cold)")
                if spec.gang and gang is None:
                    from quant.gang import Gang
                    gang = Gang(spec.gang)
                rec, traj = _one_layer(donor, spec, layer, cold[layer], traj, weights, rope, out, log, gang)
                records[layer] = rec
                progress.advance(task)
    finally:
        if gang is not None:
            gang.close()
    log("done", layers=layers, calib=stats)
    return records


def _one_layer(donor, spec, layer, cold, traj, weights, rope, out, log, gang) -> tuple[dict, dict]:
    t0 = time.perf_counter()
    problem = L.build_problem(donor, layer, cold, traj, weights, spec.target, rope)
    projs, hess = L.initial_fit(donor, problem, spec.fit)
    base = L.baseline_rels(donor, problem, hess, spec.pv.emulate) if spec.compare else {}
    base.pop("_weights", None)
    init = L.states_from(projs, cold)
    init_rel = Tuner(problem, init, Reducer(), spec.pv).rel("val")
    tuned = L.states_from(projs, cold)
    log("layer_start", layer=layer, cold=cold, arvq_init_val_rel=init_rel, **base)
    if gang is not None:
        crash = spec.crash[1:] if spec.crash and spec.crash[0] == layer else None
        tuned, result = gang.tune(problem, tuned, spec.pv, crash)
    else:
        result = L.tune_local(problem, tuned, spec.pv, log)
    # every float bit of the tuned latents (what bitwise gang claims are checked on, beyond the codes)
    latents = digest_many({f"{s.expert}/{p}/{k}": getattr(s.lat[p], k) for s in tuned for p in PROJS
                           for k in ("books", "logs", "idx")})
    keep, gates = L.gates(problem, init, tuned, spec.pv)
    projs, replay = L.export_checked(problem, keep, spec.pv)
    gates.update(replay)
    reloaded = {p: store.from_bytes(store.to_bytes(projs[p], layer, p), f"layer {layer} {p}") for p in PROJS}
    traj = advance(donor, layer, traj, L.weights_of(reloaded, cold), spec.pv.emulate, rope)
    cache = _save_cache(out, layer, traj)
    hist = [{k: h[k] for k in ("update", "val_rel", "train_loss") if k in h} for h in result["history"]]
    rec = {"spec": json.loads(json.dumps(spec.fingerprint(), default=_json)), "cold": cold,
           "hot": [e for e in range(donor.n_experts) if e not in cold], "val_rel": {**base, "arvq_init": init_rel,
           "arvq_pv": gates["val_final"]}, "gates": gates, "pv": {k: result[k] for k in
           ("initial_val_rel", "best_val_rel", "best_update", "stop")}, "reassign": result["reassign"],
           "history": hist, "cache_blake3": cache, "tuned_latents_blake3": latents,
           "seconds": time.perf_counter() - t0, "gang": spec.gang, "donor_files": donor_files(donor),
           "fit_config": config_dict(spec.fit)}
    store.write_layer(out, layer, projs, meta=rec)
    back = store.load_layer(out, layer)  # digests re-verified from disk
    for p in PROJS:
        for name in ("indices", "codebooks", "scales"):
            if not bits_equal(getattr(back[p], name), getattr(projs[p], name)):
                raise IntegrityError(out / store.layer_dir(layer), f"{p} {name} as exported", "different bits")
    log("layer_published", layer=layer, gates=gates, seconds=rec["seconds"])
    return rec, traj


def run_main(spec: RunSpec, threads: int = 0) -> int:
    """`quant run`: run the spec, print a table of every layer."""
    from rich.table import Table

    if threads:
        torch.set_num_threads(threads)
    model, out, target = spec.model, spec.out, spec.target
    console = Console()
    records = run(spec, console)
    table = Table(title=f"ARVQ {model} -> {out} (target {target})",
                  caption="val reference_rel = ||frozen + cold - reference|| / ||reference|| (whole block)")
    for col in ("layer", "cold", "RTN2", "GPTQ2", "ARVQ init", "ARVQ+PV", "best@", "val", "audit", "replay", "kept"):
        table.add_column(col, justify="right")
    for layer in sorted(records):
        r = records[layer]
        v, g = r["val_rel"], r["gates"]
        f = lambda k: f"{v[k]:.5f}" if k in v else "-"
        table.add_row(str(layer), ",".join(map(str, r["cold"])), f("rtn2"), f("gptq2"), f("arvq_init"), f("arvq_pv"),
                      str(r["pv"]["best_update"]), "pass" if g["validation"] else "FAIL",
                      "pass" if g["audit"] else "FAIL", "pass" if g["replay"] else "FAIL", g["kept"])
    console.print(table)
    return 0
