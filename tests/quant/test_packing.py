"""Index tiles and the on-disk layout: exact round trips, digest checks, corrupted files refused by name."""
import json

import pytest
import torch

from quant.errors import FormatError, IntegrityError
from quant.format import decode_all
from quant.packing import TILE_WORDS, pack_nibbles, pack_tiles, unpack_nibbles, unpack_tiles
from quant.store import MANIFEST, load_layer, read_manifest, write_layer


def test_tiles_round_trip_and_layout(make_projection):
    p = make_projection(seed=3, e=2, n=32, k=256)
    tiles = pack_tiles(p.indices)
    assert tiles.dtype == torch.uint32 and tiles.shape == (2, 2, 4, TILE_WORDS)
    assert torch.equal(unpack_tiles(tiles), p.indices)
    # lane 5 (gid 1, tig 1), word 2*5 = a-indices of (row 1, grp 1), (1, 5), (9, 1), (9, 5) of tile (0, 0)
    w = int(tiles[0, 0, 0, 10])
    want = [int(p.indices[0, r, g, 0]) for r, g in ((1, 1), (1, 5), (9, 1), (9, 5))]
    assert [(w >> (8 * j)) & 0xFF for j in range(4)] == want
    w = int(tiles[1, 1, 2, 11])  # b-word of lane 5 in tile (rows 16.., groups 16..)
    want = [int(p.indices[1, 16 + r, 16 + g, 1]) for r, g in ((1, 1), (1, 5), (9, 1), (9, 5))]
    assert [(w >> (8 * j)) & 0xFF for j in range(4)] == want


def test_tiles_refuse_bad_shapes():
    with pytest.raises(FormatError, match="N % 16"):
        pack_tiles(torch.zeros(1, 8, 16, 2, dtype=torch.uint8))


def test_nibbles_round_trip():
    c = torch.arange(16, dtype=torch.uint8).repeat(4).reshape(2, 32)
    packed = pack_nibbles(c)
    assert packed[0, 0].item() == 0x10 and torch.equal(unpack_nibbles(packed), c)


def test_store_round_trip_bit_exact(tmp_path, make_projection):
    w13, w2 = make_projection(seed=4, e=2, n=32, k=256, experts=(1, 6)), make_projection(seed=5, e=2, n=16, k=128,
                                                                                         experts=(1, 6))
    entry = write_layer(tmp_path, 3, {"w13": w13, "w2": w2}, meta={"note": "test"})
    write_layer(tmp_path, 4, {"w13": w13})
    assert entry["projections"]["w13"]["bits_per_weight"]["indices"] == 2.0
    back = load_layer(tmp_path, 3)
    for name, p in (("w13", w13), ("w2", w2)):
        assert back[name].experts == p.experts
        assert torch.equal(decode_all(back[name]).view(torch.int32), decode_all(p).view(torch.int32))
    assert sorted(read_manifest(tmp_path)["layers"]) == ["3", "4"]
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".")]  # no temp dirs left behind
    write_layer(tmp_path, 3, {"w13": w2})  # rewrite replaces the layer atomically
    assert list(load_layer(tmp_path, 3)) == ["w13"]


def test_corrupted_file_refused_naming_it(tmp_path, make_projection):
    write_layer(tmp_path, 7, {"w2": make_projection(seed=6, e=1, n=16, k=128)})
    f = tmp_path / "layer_0007" / "w2.safetensors"
    data = bytearray(f.read_bytes())
    data[-5] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"layer_0007/w2\.safetensors.*blake3"):
        load_layer(tmp_path, 7)
    f.unlink()
    with pytest.raises(IntegrityError, match="w2.safetensors"):
        load_layer(tmp_path, 7)


def test_unknown_layout_version_refused(tmp_path, make_projection):
    write_layer(tmp_path, 0, {"w2": make_projection(seed=7, e=1, n=16, k=128)})
    m = json.loads((tmp_path / MANIFEST).read_text())
    m["layout_version"] = 99
    (tmp_path / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(FormatError, match="layout_version"):
        load_layer(tmp_path, 0)


def test_failed_verification_writes_nothing(tmp_path, make_projection, monkeypatch):
    import quant.store as store
    p = make_projection(seed=8, e=1, n=16, k=128)
    real = store.from_bytes

    def corrupt(data, source):
        q = real(data, source)
        idx = q.indices.clone()
        idx[0, 3, 2, 1] ^= 1
        return type(q)(q.codebooks, idx, q.scales, q.global_scale, q.experts)
    monkeypatch.setattr(store, "from_bytes", corrupt)
    with pytest.raises(IntegrityError, match="layer 2 projection w13 expert 0.*indices"):
        write_layer(tmp_path, 2, {"w13": p})
    assert not (tmp_path / MANIFEST).exists() and not list(tmp_path.glob("layer_*"))
