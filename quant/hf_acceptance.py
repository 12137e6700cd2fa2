"""ARVQ on a Hugging Face MoE checkpoint, end to end: quantize, load back, held-out cross-entropy.

    .venv/bin/python -m quant.hf_acceptance --model tests/quant/hf_models/tiny-mixtral --corpus data/demo \\
        --work runs/hf-mixtral --json docs/results/arvq-hf-tiny-mixtral.json

Runs the sequential pipeline twice into WORK (ARVQ init: 0 PV updates; ARVQ + PV), then loads each output
into the checkpoint's transformers model (quant.hf_loader) and measures the mean next-token CE on the
calibration's held-out documents (windows no split has seen) for: unquantized, RTN-2bit and GPTQ-2bit
(Hessians from the donor trajectory, weights written into the model), ARVQ init, ARVQ + PV; and runs
generate() on the ARVQ + PV model.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import torch

from quant import sequential
from quant.acceptance import scalar_baselines
from quant.calib import CalibConfig
from quant.hf_donor import HFDonor, load_hf_donor, load_model
from quant.hf_loader import heldout_ce, load_quantized, with_expert_weights
from stream.fileio import atomic_write_bytes

VARIANTS = ("unquantized", "rtn2", "gptq2", "arvq_init", "arvq_pv")


def publish_both(spec: sequential.RunSpec, donor: HFDonor, data: dict) -> tuple[Path, Path, dict[int, list[int]]]:
    """(ARVQ init output, ARVQ + PV output, cold experts per layer): spec run with 0 updates and as given."""
    work = Path(spec.out)
    init = sequential.run(replace(spec, out=str(work / "init"), pv=replace(spec.pv, updates=0)),
                          donor=donor, data=data)
    sequential.run(replace(spec, out=str(work / "pv")), donor=donor, data=data)
    return work / "init", work / "pv", {layer: rec["cold"] for layer, rec in init.items()}


def models(donor: HFDonor, data: dict, cold: dict, init_out: Path, pv_out: Path) -> dict:
    """Each variant as a transformers model (float32, eval)."""
    base = scalar_baselines(donor, cold, data)
    return {"unquantized": load_model(donor.ck),
            "rtn2": with_expert_weights(load_model(donor.ck), base["rtn2"]),
            "gptq2": with_expert_weights(load_model(donor.ck), base["gptq2"]),
            "arvq_init": load_quantized(donor.ck.path, init_out),
            "arvq_pv": load_quantized(donor.ck.path, pv_out)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a Hugging Face MoE checkpoint directory")
    ap.add_argument("--corpus", default="data/demo", help="calibration corpus directory (the stream's layout)")
    ap.add_argument("--work", required=True, help="directory for the two pipeline outputs (init/, pv/)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--windows", type=int, default=256, help="held-out windows for the CE")
    a = ap.parse_args(argv)
    t0 = time.time()
    donor = load_hf_donor(a.model)
    spec = sequential.RunSpec(model=a.model, out=a.work, calib=CalibConfig(corpus=a.corpus))
    data = donor.calibration(spec.calib)
    init_out, pv_out, cold = publish_both(spec, donor, data)
    held = data["held_out"][:a.windows]
    ms = models(donor, data, cold, init_out, pv_out)
    ce = {k: heldout_ce(ms[k], held) for k in VARIANTS}
    sample = ms["arvq_pv"].generate(input_ids=held[:1, :16], max_new_tokens=16, do_sample=False)[0].tolist()
    published = json.loads((pv_out / "manifest.json").read_text())["layers"]
    rel = {int(k): v["meta"]["val_rel"] for k, v in published.items()}
    res = {"model": a.model, "model_type": donor.ck.layout.model_type, "corpus": a.corpus, "cold": cold,
           "heldout_windows": int(held.shape[0]), "seq_len": int(held.shape[1] - 1), "ce": ce,
           "ce_vs_unquantized": {k: ce[k] - ce["unquantized"] for k in VARIANTS}, "pv_layer_val_rel": rel,
           "generate_ids": sample, "seconds": round(time.time() - t0, 1),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.machine(),
           "torch": torch.__version__, "checkpoint_files": donor.ck.files}
    for k in VARIANTS:
        print(f"{k:12s} held-out CE {ce[k]:.4f} ({ce[k] - ce['unquantized']:+.4f})")
    if a.json:
        atomic_write_bytes(Path(a.json), (json.dumps(res, indent=1, sort_keys=True) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
