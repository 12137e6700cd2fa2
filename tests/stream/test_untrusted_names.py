"""File names read from files (a manifest's shards and tokenizer, run.json's copies) stay inside their directory:
`..`, absolute paths and symbolic links below the root are refused with one error naming the file and field."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import stream
from replay.errors import AuditRefused
from replay.rundesc import check_copies
from stream.errors import StreamError
from stream.fileio import blake3_file, canonical_json, blake3_bytes, member
from stream.manifest import MANIFEST_NAME, load_manifest

SHARD = "shards/math/math-00000.jsonl.zst"


@pytest.fixture
def corpus(demo_corpus: Path, tmp_path: Path) -> Path:
    out = tmp_path / "corpus"
    shutil.copytree(demo_corpus, out)
    return out


def _edit(root: Path, shard: str | None = None, tokenizer: str | None = None) -> None:
    path = root / MANIFEST_NAME
    d = json.loads(path.read_text())
    if shard is not None:
        d["sources"][-1]["shards"][0]["path"] = shard
    if tokenizer is not None:
        d["tokenizer"]["path"] = tokenizer
    path.write_text(json.dumps(d))


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "shards/../../x", "shards\\math", "a\0b", ""])
def test_a_shard_path_leaving_the_corpus_is_refused_at_parse_time(corpus, bad):
    _edit(corpus, shard=bad)
    with pytest.raises(StreamError) as e:
        load_manifest(corpus)
    msg = str(e.value)
    assert f"manifest in {corpus}" in msg and "source 'math' shard path" in msg and repr(bad) in msg


@pytest.mark.parametrize("bad", ["../tokenizer.json", "/etc/passwd"])
def test_a_tokenizer_path_leaving_the_corpus_is_refused_at_parse_time(corpus, bad):
    _edit(corpus, tokenizer=bad)
    with pytest.raises(StreamError) as e:
        stream.open_stream(corpus, seq_len=16, seed=1)
    msg = str(e.value)
    assert f"manifest in {corpus}" in msg and "tokenizer path" in msg and repr(bad) in msg


def test_a_shard_reached_through_a_symlink_is_refused(corpus, tmp_path):
    outside = tmp_path / "outside"
    shutil.move(corpus / "shards" / "math", outside)  # the same bytes: only the link is wrong
    (corpus / "shards" / "math").symlink_to(outside)
    load_manifest(corpus)  # the names are fine; the walk below the root is not
    with pytest.raises(StreamError) as e:
        stream.open_stream(corpus, seq_len=16, seed=1)
    msg = str(e.value)
    assert "shard path" in msg and repr(SHARD) in msg and "symbolic link" in msg and str(corpus / "shards/math") in msg


def test_a_tokenizer_that_is_a_symlink_is_refused(corpus, tmp_path):
    shutil.move(corpus / "tokenizer.json", tmp_path / "tok.json")
    (corpus / "tokenizer.json").symlink_to(tmp_path / "tok.json")
    with pytest.raises(StreamError, match=r"tokenizer path: 'tokenizer.json' goes through a symbolic link"):
        stream.open_stream(corpus, seq_len=16, seed=1)


def test_a_corpus_root_that_is_a_symlink_is_fine(corpus, tmp_path):
    link = tmp_path / "data"
    link.symlink_to(corpus)  # e.g. data/ -> /mnt/disk
    s = stream.open_stream(link, seq_len=16, seed=1)
    assert s.windows(0, 1).shape == (1, 17)


def test_the_checks_leave_the_manifest_digest_unchanged(corpus):
    m = load_manifest(corpus)
    assert m.digest == blake3_bytes(canonical_json(json.loads((corpus / MANIFEST_NAME).read_text())))
    assert m.tokenizer_file == corpus / "tokenizer.json"


def test_member(tmp_path):
    (tmp_path / "a").mkdir()
    assert member(tmp_path, "a/b.txt") == tmp_path / "a" / "b.txt"
    assert member(tmp_path, "new/file") == tmp_path / "new" / "file"  # need not exist yet
    link = tmp_path / "root-link"
    link.symlink_to(tmp_path / "a")
    assert member(link, "b.txt") == link / "b.txt"  # the root itself may be a link
    for bad, why in [("", "is empty"), ("/etc/passwd", "is absolute"), ("..", "'..' component"),
                     ("a/../../x", "'..' component"), ("a\\..\\x", "backslash"), ("a\0", "NUL"), (3, "not a string")]:
        with pytest.raises(ValueError, match=why) as e:
            member(tmp_path, bad)
        assert repr(bad) in str(e.value)
    (tmp_path / "a" / "up").symlink_to(tmp_path.parent)
    with pytest.raises(ValueError, match=r"'a/up/x' goes through a symbolic link"):
        member(tmp_path, "a/up/x")


def test_run_json_files_entry_leaving_the_run_is_refused(tmp_path):
    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    (run / "data" / "ok.json").write_text("{}")
    good = {"data/ok.json": blake3_file(run / "data" / "ok.json")}
    check_copies(run, {"files": good})
    with pytest.raises(AuditRefused) as e:
        check_copies(run, {"files": {**good, "../../etc/passwd": "00" * 32}})
    msg = str(e.value)
    assert str(run / "run.json") in msg and "files entry '../../etc/passwd'" in msg and "'..' component" in msg
    (run / "data" / "link.json").symlink_to(run / "data" / "ok.json")
    with pytest.raises(AuditRefused, match=r"files entry 'data/link.json' goes through a symbolic link"):
        check_copies(run, {"files": {"data/link.json": good["data/ok.json"]}})
