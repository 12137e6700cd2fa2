"""Refused input on the command line: every subcommand, given a bad argument, a missing or malformed file, run
directory or corpus, exits 2 with one line on stderr naming the offending thing, and no traceback.

Each case runs `python -m app ...`'s main in its own process (forked from one that imported the app), from a
scratch directory holding a real 2-step tiny run and broken copies of its files. Every case is refused before any
Ray instance would start. The results are checked one test per case."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (id, argv, what the last stderr line must name). Paths are relative to the scratch directory (see `scratch`).
CASES = [
    # train
    ("train-corpus-no-manifest", ["train", "--steps", "1", "--out", "o1", "--corpus", "nomanifest"],
     ["nomanifest/manifest.json", "data build-demo"]),
    ("train-corpus-corrupt-manifest", ["train", "--steps", "1", "--out", "o3", "--corpus", "badmanifest"],
     ["badmanifest/manifest.json", "not valid JSON"]),
    ("train-unknown-preset", ["train", "--config", "nosuch", "--steps", "1", "--out", "o4"], ["--config", "nosuch"]),
    ("train-zero-steps", ["train", "--steps", "0", "--out", "o5", "--corpus", "corpus"], ["--steps", ">= 1"]),
    ("train-negative-checkpoint-every", ["train", "--steps", "1", "--out", "o6", "--checkpoint-every", "-3"],
     ["--checkpoint-every", "-3"]),
    ("train-workers-reversed", ["train", "--steps", "1", "--out", "o8", "--workers", "5:2"], ["--workers", "5:2"]),
    ("train-out-under-a-file", ["train", "--steps", "1", "--out", "afile/run", "--corpus", "corpus"], ["afile"]),
    # report
    ("report-missing-run", ["report", "--run", "nosuchrun"], ["nosuchrun"]),
    # data
    ("inspect-unknown-schedule", ["data", "inspect", "--step", "0", "--corpus", "corpus", "--schedule", "foo"],
     ["--schedule", "foo", "demo"]),
    ("inspect-no-manifest", ["data", "inspect", "--step", "0", "--corpus", "nomanifest"],
     ["nomanifest/manifest.json"]),
    ("inspect-negative-step", ["data", "inspect", "--step", "-1", "--corpus", "corpus"], ["--step", "-1"]),
    ("inspect-corrupt-state", ["data", "inspect", "--step", "0", "--corpus", "corpus", "--states", "badstates"],
     ["badstates/state-000000000000.json", "not valid JSON"]),
    ("inspect-missing-states", ["data", "inspect", "--step", "0", "--corpus", "corpus", "--states", "nosuchdir"],
     ["--states", "nosuchdir"]),
    ("inspect-run-and-a-seed", ["data", "inspect", "--step", "0", "--run", "run", "--seed", "1"], ["--seed", "--run"]),
    ("inspect-run-beyond-the-log", ["data", "inspect", "--step", "9", "--run", "run"],
     ["run/hashlog.jsonl", "steps 0..1", "--step 9"]),
    ("prepare-corrupt-json", ["data", "prepare", "--config", "corrupt.json"], ["corrupt.json", "not valid JSON"]),
    ("prepare-corrupt-toml", ["data", "prepare", "--config", "corrupt.toml"], ["corrupt.toml", "not valid TOML"]),
    ("prepare-missing-config", ["data", "prepare", "--config", "nosuch.json"], ["nosuch.json"]),
    ("build-demo-under-a-file", ["data", "build-demo", "--out", "afile/demo"], ["afile"]),
    ("build-demo-tiny-vocab", ["data", "build-demo", "--out", "o9", "--vocab-size", "3"], ["vocab_size", "3"]),
    # audit
    ("replay-no-hashlog", ["audit", "replay", "--run", "nohashlog", "--until-step", "0"], ["nohashlog", "hashlog"]),
    ("replay-corrupt-config", ["audit", "replay", "--run", "badcfg", "--until-step", "0"],
     ["badcfg/config.json", "not valid JSON"]),
    ("replay-beyond-the-log", ["audit", "replay", "--run", "run", "--until-step", "7"],
     ["run/hashlog.jsonl", "0..1", "0..7"]),
    ("replay-negative-until", ["audit", "replay", "--run", "run", "--until-step", "-1"], ["--until-step", "-1"]),
    ("replay-corrupt-checkpoint-manifest", ["audit", "replay", "--run", "badckpt", "--until-step", "1",
                                            "--from-checkpoint", "1"],
     ["badckpt/checkpoints/step-000000000001/manifest.json", "not valid JSON"]),
    ("replay-corpus-corrupt-manifest", ["audit", "replay", "--run", "run", "--until-step", "0", "--corpus",
                                        "badmanifest"], ["badmanifest/manifest.json", "not valid JSON"]),
    ("batch-steps-reversed", ["audit", "batch", "--run", "run", "--steps", "5:2"], ["--steps 5:2"]),
    ("batch-zero-segment", ["audit", "batch", "--run", "run", "--segment", "0"], ["--segment", "0"]),
    ("coverage-corrupt-certificate", ["audit", "coverage", "--run", "badcert"], ["badcert", "x.parquet"]),
    ("compare-corrupt-log", ["audit", "compare", "run", "badlog"],
     ["badlog/hashlog.jsonl", "not JSON", "intact copy"]),
    ("site-corrupt-config", ["audit", "site", "--run", "badcfg", "--out", "s1"], ["badcfg/config.json",
                                                                                  "not valid JSON"]),
    ("site-out-inside-the-run", ["audit", "site", "--run", "run", "--out", "run/site"], ["--out run/site",
                                                                                        "inside the run directory"]),
    ("site-bad-documents-steps", ["audit", "site", "--run", "run", "--out", "s2", "--documents-steps", "9:3"],
     ["--documents-steps 9:3"]),
    ("audit-unknown-command", ["audit", "nosuch"], ["nosuch", "invalid choice"]),
    # quant
    ("quant-fit-bad-layers", ["quant", "fit", "--model", "synthetic", "--layers", "x", "--out", "q1"],
     ["--layers", "'x'"]),
    ("quant-fit-negative-threads", ["quant", "fit", "--model", "synthetic", "--layers", "0", "--out", "q3",
                                    "--threads", "-1"], ["--threads", "-1"]),
    ("quant-run-missing-run", ["quant", "run", "--model", "nosuchrun", "--out", "q4"], ["nosuchrun"]),
    # demo
    ("demo-zero-steps", ["demo", "--steps", "0"], ["--steps", ">= 1"]),
]


def _truncate(path: Path, keep: int = 40) -> None:
    """Cut a file short, as an interrupted copy would."""
    path.write_bytes(path.read_bytes()[:keep])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory, demo_corpus, tiny, one_thread) -> Path:
    """A 2-step tiny run (checkpoints after steps 1 and 2), its corpus, and broken copies of their files."""
    from training.train import TrainOptions, train

    d = tmp_path_factory.mktemp("cli-errors")
    os.symlink(demo_corpus, d / "corpus")
    cfg = tiny.replace(**{"train.corpus": str(d / "corpus")})
    train(cfg, d / "run", TrainOptions(steps=2, checkpoint_every=1, eval_every=0, progress=False))

    def copy(name: str) -> Path:
        return Path(shutil.copytree(d / "run", d / name))

    (copy("nohashlog") / "hashlog.jsonl").unlink()
    log = copy("badlog") / "hashlog.jsonl"
    log.write_text("garbage{\n" + log.read_text())  # a first line that is not JSON
    _truncate(copy("badcfg") / "config.json")
    _truncate(copy("badckpt") / "checkpoints" / "step-000000000001" / "manifest.json")
    certs = copy("badcert") / "audit" / "certificates"
    certs.mkdir(parents=True)
    (certs / "x.parquet").write_bytes(b"PAR1 not really a parquet file")
    (d / "nomanifest").mkdir()
    (d / "badmanifest").mkdir()
    (d / "badmanifest" / "manifest.json").write_bytes((demo_corpus / "manifest.json").read_bytes()[:100])
    (d / "badstates").mkdir()
    (d / "badstates" / "state-000000000000.json").write_text('{"stream": {"pos')
    (d / "corrupt.json").write_text('{"sources": [')
    (d / "corrupt.toml").write_text("sources = [\n")
    (d / "afile").write_text("a file, not a directory\n")
    return d


def _case(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[int, str]:
    """`python -m app *argv` in this (forked) process: (exit status, stderr), as the interpreter would end it."""
    import contextlib
    import io
    import traceback

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            from app.cli import main

            code = main(argv)
        except SystemExit as e:  # argparse's refusals, and app/__main__.py's own exit
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # what the interpreter prints for an uncaught exception
            traceback.print_exc()
            code = 1
    return int(code or 0), err.getvalue()


@pytest.fixture(scope="module")
def results(scratch) -> dict[str, subprocess.CompletedProcess]:
    """Every case's finished process, by id. Each runs in a process of its own, forked from a server process that
    has imported the app once (what a case's own start would spend most of its time on): `python -m app` but for
    the imports. Two at a time."""
    import multiprocessing

    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("RAY_ADDRESS", None)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["app.cli"])
    with ctx.Pool(2, maxtasksperchild=1) as pool:
        done = pool.starmap(_case, [(argv, str(scratch), env) for _, argv, _ in CASES])
    return {name: subprocess.CompletedProcess(argv, code, "", err)
            for (name, argv, _), (code, err) in zip(CASES, done)}


def test_every_subcommand_has_a_case():
    """The cases cover every subcommand the parser offers (a new one needs a case here)."""
    import argparse

    from app.cli import build_parser

    def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return {prefix}
        return {c for name, p in subs[0].choices.items() for c in commands(p, prefix + (name,))}

    covered = {tuple(argv[:2]) if argv[0] in ("data", "audit", "quant") else (argv[0],) for _, argv, _ in CASES}
    assert commands(build_parser()) <= covered


@pytest.mark.parametrize("name, argv, names", CASES, ids=[c[0] for c in CASES])
def test_refused_input_is_one_line_and_exit_2(results, name, argv, names):
    p = results[name]
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, f"exit {p.returncode}; stderr:\n{p.stderr[-3000:]}"
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    last = lines[-1]
    assert last.startswith("error: ") or ": error: " in last, p.stderr[-3000:]  # ours, or argparse's
    for what in names:
        assert what in last, f"{what!r} not named in: {last}"

