"""The versioned on-disk layout of packed cold experts: safetensors files + a JSON manifest with blake3s.

    OUT/manifest.json                 format, layout version, tile layout, per layer and projection:
                                      file, blake3, bytes, [N, K], expert ids, bits/weight, sample digest
    OUT/layer_0003/w13.safetensors    codebooks uint8 [E, 2, 256, 4] (FP4 nibbles, even atom low),
    OUT/layer_0003/w2.safetensors     index_tiles uint32 [E, N/16, K/64, 64] (packing.py), scales
                                      float8_e4m3fn [E, N, K/128], global_scale float32 [], experts int32 [E]

Before anything is written, a layer is serialized in memory, parsed back, and every expert's indices,
codebooks and scales must round-trip exactly and a sample of decoded rows must match bit for bit.
Writes are atomic: the layer's files go to a temporary directory that is renamed into place, then the
manifest is replaced atomically; the manifest is the commit point. Loading checks the file's blake3
before parsing it, and parses with safetensors only: nothing is unpickled. One writer per OUT.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import blake3
import torch
from safetensors.torch import load as st_load, save as st_save

from kernels.digest import bits_equal, first_mismatch, tensor_digest
from quant.errors import FormatError, IntegrityError
from quant.format import NAME, RVQProjection, bits_per_weight, decode
from quant.packing import pack_nibbles, pack_tiles, unpack_nibbles, unpack_tiles
from stream.fileio import atomic_directory, atomic_write_bytes, check_safetensors_bytes, member

LAYOUT_VERSION = 1
TILE_LAYOUT = "m16n8k16_a_lane_pairs_v1"
MANIFEST = "manifest.json"
SAMPLE_ROWS = 8


def layer_dir(layer: int) -> str:
    return f"layer_{layer:04d}"


def to_bytes(p: RVQProjection, layer: int, projection: str) -> bytes:
    """The safetensors bytes of one (layer, projection)."""
    tensors = {
        "codebooks": pack_nibbles(p.codebooks.cpu()).contiguous(),
        "index_tiles": pack_tiles(p.indices.cpu()).contiguous(),
        "scales": p.scales.cpu().contiguous(),
        "global_scale": p.global_scale.cpu().reshape(()).contiguous(),
        "experts": torch.tensor(p.experts, dtype=torch.int32),
    }
    meta = {"format": NAME, "layout_version": str(LAYOUT_VERSION), "tile_layout": TILE_LAYOUT,
            "layer": str(layer), "projection": projection}
    # one key holding canonical JSON: safetensors writes a metadata map in hash order, which differs
    # between processes, and the file's blake3 must be a function of the content only
    return st_save(tensors, metadata={"rvq": json.dumps(meta, sort_keys=True, separators=(",", ":"))})


def from_bytes(data: bytes, source: str) -> RVQProjection:
    """Parse safetensors bytes (no pickle) back into an RVQProjection; `source` names them in errors."""
    try:
        check_safetensors_bytes(data)  # the header's sizes fit the bytes before the parser allocates from them
        t = st_load(data)
    except Exception as exc:  # safetensors raises its own types; name the file
        raise FormatError(f"{source}: not a readable safetensors file: {exc}") from exc
    missing = {"codebooks", "index_tiles", "scales", "global_scale", "experts"} - set(t)
    if missing:
        raise FormatError(f"{source}: missing tensors {sorted(missing)}")
    return RVQProjection(codebooks=unpack_nibbles(t["codebooks"]), indices=unpack_tiles(t["index_tiles"], source),
                         scales=t["scales"], global_scale=t["global_scale"].reshape(()),
                         experts=tuple(int(e) for e in t["experts"].tolist()))


def sample_rows(n: int, count: int = SAMPLE_ROWS) -> torch.Tensor:
    """Evenly spaced row indices, first and last included."""
    count = min(count, n)
    return torch.unique(torch.linspace(0, n - 1, count).round().long())


def _sample_digest(p: RVQProjection) -> str:
    rows = sample_rows(p.shape[0])
    h = blake3.blake3()
    for s in range(p.n_experts):
        h.update(tensor_digest(decode(p, s, rows)).encode())
    return h.hexdigest()


def verify_round_trip(p: RVQProjection, back: RVQProjection, where: str) -> None:
    """Every expert's indices, books and scales equal; sampled decoded rows equal bit for bit."""
    if back.experts != p.experts or not bits_equal(back.global_scale, p.global_scale.cpu()):
        raise IntegrityError(where, f"experts {p.experts}, global {p.global_scale.item()}",
                             f"experts {back.experts}, global {back.global_scale.item()}", "header round trip")
    rows = sample_rows(p.shape[0])
    for s, e in enumerate(p.experts):
        for name in ("indices", "codebooks", "scales"):
            a, b = getattr(p, name)[s].cpu(), getattr(back, name)[s]
            if not bits_equal(a, b):
                raise IntegrityError(f"{where} expert {e}", f"{name} round trip exact",
                                     f"first mismatch {first_mismatch(a, b)}")
        a, b = decode(p, s, rows).cpu(), decode(back, s, rows)
        if not bits_equal(a, b):
            raise IntegrityError(f"{where} expert {e}", "decoded sample rows equal bit for bit",
                                 f"first mismatch {first_mismatch(a, b)}")


def read_manifest(out: str | Path) -> dict:
    """The manifest of OUT (an empty one when none exists yet); refuses unknown formats and versions."""
    path = Path(out) / MANIFEST
    if not path.exists():
        return {"format": NAME, "layout_version": LAYOUT_VERSION, "tile_layout": TILE_LAYOUT, "layers": {}}
    try:
        m = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FormatError(f"{path}: not valid JSON: {exc}") from exc
    if m.get("format") != NAME or m.get("layout_version") != LAYOUT_VERSION or m.get("tile_layout") != TILE_LAYOUT:
        raise FormatError(f"{path}: expected format {NAME} layout_version {LAYOUT_VERSION} tile_layout "
                          f"{TILE_LAYOUT}, got {m.get('format')} {m.get('layout_version')} {m.get('tile_layout')}")
    return m


def write_layer(out: str | Path, layer: int, projections: dict[str, RVQProjection], meta: dict | None = None) -> dict:
    """Verify, then atomically write one layer's projections and commit them to the manifest; its entry."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out)
    blobs, entry = {}, {"dir": layer_dir(layer), "projections": {}, "meta": meta or {}}
    for proj, p in projections.items():
        where = f"layer {layer} projection {proj}"
        data = to_bytes(p, layer, proj)
        verify_round_trip(p, from_bytes(data, where), where)  # nothing is written unless this passes
        blobs[proj] = data
        n, k = p.shape
        entry["projections"][proj] = {
            "file": f"{layer_dir(layer)}/{proj}.safetensors", "blake3": blake3.blake3(data).hexdigest(),
            "bytes": len(data), "shape": [n, k], "experts": list(p.experts),
            "bits_per_weight": bits_per_weight(n, k, p.n_experts), "decoded_sample_blake3": _sample_digest(p)}
    final = out / layer_dir(layer)
    old = None
    if final.exists():  # a republished layer: the old files go aside until the manifest no longer lists them
        old = Path(tempfile.mkdtemp(prefix=f".old-{layer_dir(layer)}-", dir=out))
        os.rename(final, old / "layer")
    try:
        with atomic_directory(final) as tmp:
            for proj, data in blobs.items():
                (tmp / f"{proj}.safetensors").write_bytes(data)
        manifest["layers"][str(layer)] = entry
        atomic_write_bytes(out / MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    except BaseException:
        if old is not None:  # the manifest still lists the old layer: put its files back
            shutil.rmtree(final, ignore_errors=True)
            os.rename(old / "layer", final)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return entry


def _checked_bytes(out: Path, layer, projection: str, rec: dict) -> tuple[Path, bytes]:
    """(path, bytes) of a published file after its blake3 matches the manifest's record."""
    try:
        path = member(out, rec["file"])
    except ValueError as exc:
        raise FormatError(f"{out / MANIFEST}: layer {layer} projection {projection} file {exc}") from None
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise IntegrityError(path, f"a file of {rec['bytes']} bytes", "no such file") from None
    got = blake3.blake3(data).hexdigest()
    if got != rec["blake3"]:
        raise IntegrityError(path, f"blake3 {rec['blake3']}", f"blake3 {got}", "file changed since it was written")
    return path, data


def load_projection(out: str | Path, layer: int, projection: str, manifest: dict | None = None) -> RVQProjection:
    """One (layer, projection), after its file's blake3 matches the manifest; decoded sample re-checked."""
    out = Path(out)
    manifest = manifest or read_manifest(out)
    try:
        rec = manifest["layers"][str(layer)]["projections"][projection]
    except KeyError:
        raise FormatError(f"{out / MANIFEST}: no layer {layer} projection {projection}") from None
    path, data = _checked_bytes(out, layer, projection, rec)
    p = from_bytes(data, str(path))
    if list(p.shape) != rec["shape"] or list(p.experts) != rec["experts"]:
        raise FormatError(f"{path}: shape {p.shape} experts {p.experts} disagree with the manifest")
    sample = _sample_digest(p)
    if sample != rec["decoded_sample_blake3"]:
        raise IntegrityError(path, f"decoded sample {rec['decoded_sample_blake3']}", f"decoded sample {sample}")
    return p


def verify_files(out: str | Path, manifest: dict | None = None) -> None:
    """Every published file's blake3 against the manifest (no decoding): what a resumed run stands on."""
    out = Path(out)
    manifest = manifest or read_manifest(out)
    for layer, entry in sorted(manifest["layers"].items(), key=lambda kv: int(kv[0])):
        for proj, rec in entry["projections"].items():
            _checked_bytes(out, layer, proj, rec)


def load_layer(out: str | Path, layer: int) -> dict[str, RVQProjection]:
    """Every projection of a layer, each verified (digest first) as load_projection does."""
    m = read_manifest(out)
    if str(layer) not in m["layers"]:
        raise FormatError(f"{Path(out) / MANIFEST}: no layer {layer}; has {sorted(m['layers'], key=int)}")
    return {proj: load_projection(out, layer, proj, m) for proj in m["layers"][str(layer)]["projections"]}
