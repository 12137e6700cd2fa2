"""Crafted safetensors headers (absurd sizes, offsets past the file, shapes that do not match their bytes) and
symbolic links are refused before any parser sees a checkpoint file, naming the file and the tensor."""
from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from stream.fileio import check_safetensors_bytes, check_safetensors_header
from training import checkpoint as ckpt
from training.errors import CheckpointError


def _file(header: object, data: bytes = b"", length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


CASES = {
    "huge": (_file({"w": {"dtype": "F32", "shape": [2**40], "data_offsets": [0, 2**42]}}, b"\0" * 8),
             r"tensor 'w': data_offsets \[0, 4398046511104\] not \[begin, end\]"),
    "length": (_file({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, 2**62),
               r"header length 4611686018427387904 exceeds the file"),
    "mismatch": (_file({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8),
                 r"tensor 'w': shape \[2\] of F32 is 8 bytes, data_offsets \[0, 4\] span 4"),
    "absurd shape": (_file({"w": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 8]}}, b"\0" * 8),
                     r"tensor 'w': shape .* is more than 9 bytes"),
    "overlap": (_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
                r"tensor 'b': data_offsets overlap tensor 'a'"),
    "dtype": (_file({"w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, b"\0" * 16),
              r"tensor 'w': dtype 'F128' is not a safetensors dtype"),
    "negative": (_file({"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}),
                 r"tensor 'w': shape \[-1\] is not a list of non-negative ints"),
    "not an object": (_file([1, 2]), r"header is a JSON list, not an object"),
    "not json": (_file(b"{nope"), r"header is not valid JSON"),
    "short": (b"\x10\0\0", r"shorter than its 8-byte header length"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_crafted_header_is_refused_naming_the_file_and_tensor(tmp_path, case):
    data, pattern = CASES[case]
    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=pattern):
        check_safetensors_header(path)
    with pytest.raises(ValueError, match=pattern):
        check_safetensors_bytes(data)
    with pytest.raises(CheckpointError, match=pattern) as e:
        ckpt._check_safetensors(path)
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)


def test_a_real_safetensors_file_passes(tmp_path):
    path = tmp_path / "real.safetensors"
    save_file({"a": torch.zeros(3, 4), "b": torch.ones(5, dtype=torch.bfloat16), "scalar": torch.tensor(2.0),
               "empty": torch.zeros(0, 7, dtype=torch.int64), "mask": torch.ones(3, dtype=torch.bool)},
              str(path), metadata={"k": "v"})
    check_safetensors_header(path)
    check_safetensors_bytes(path.read_bytes())
    ckpt._check_safetensors(path)


def test_symlinked_checkpoint_files_are_refused(tmp_path):
    real = tmp_path / "elsewhere.safetensors"
    save_file({"a": torch.zeros(2)}, str(real))
    d = tmp_path / "step-000000000001"
    d.mkdir()
    (d / "params.safetensors").symlink_to(real)
    with pytest.raises(CheckpointError, match=r"params.safetensors: is a symbolic link"):
        ckpt._check_safetensors(d / "params.safetensors")
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": ckpt.SCHEMA}))
    (d / "manifest.json").symlink_to(tmp_path / "manifest.json")
    with pytest.raises(CheckpointError, match=rf"{d / 'manifest.json'}: is a symbolic link"):
        ckpt.read_manifest(d)
