"""Batch audits without Ray: segment planning, certificate files, and coverage merging on a synthetic log."""
import json
from pathlib import Path

import blake3
import numpy as np
import pytest

from training.errors import ConfigError
from replay.batch import auditor_resources, default_segment, parse_steps, plan_segments, pool_size
from replay.certificates import CertificateError, RunLog, cert_path, read_certificates, write_certificates
from replay.coverage import coverage_of, draw_coverage, exit_code

N = 12


def test_segments_follow_checkpoints():
    assert plan_segments(0, 12, 4, [4, 8, 12]) == [(0, 4), (4, 8), (8, 12)]
    assert plan_segments(2, 12, 4, [4, 8, 12]) == [(2, 4), (4, 8), (8, 12)]  # later starts snap to checkpoints
    assert plan_segments(0, 12, 6, [4, 8, 12]) == [(0, 4), (4, 8), (8, 12)]  # never longer than K
    assert plan_segments(0, 12, 10, [4, 8, 12]) == [(0, 8), (8, 12)]  # whole checkpoint gaps joined up to K
    assert plan_segments(0, 12, 3, [4, 8, 12]) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12)]
    assert plan_segments(0, 25, 10, []) == [(0, 8), (8, 16), (16, 25)]  # no checkpoints: near-equal, <= K
    assert plan_segments(5, 7, 100, [4, 8]) == [(5, 7)]
    assert default_segment([100, 200, 205]) == 100 and default_segment([]) == 100
    with pytest.raises(ConfigError, match="--segment"):
        plan_segments(0, 4, 0, [])


def test_steps_parse_and_refuse():
    assert parse_steps("4:8", N) == (4, 8) and parse_steps(":", N) == (0, N) and parse_steps("3:", N) == (3, N)
    for bad in ("8:4", "0:13", "x:3", "5"):
        with pytest.raises(ConfigError, match="--steps"):
            parse_steps(bad, N)


def test_resources_refuse_what_the_cluster_lacks():
    cluster = {"CPU": 4.0, "cpu_x86": 2.0}
    req = auditor_resources("cpu", "cpu_x86", None, cluster)
    assert req == {"num_cpus": 1.0, "num_gpus": 0.0, "resources": {"cpu_x86": 1.0}}
    assert pool_size(req, cluster, 3) == 2  # two cpu_x86 slots
    assert auditor_resources("cpu", None, '{"num_cpus": 2}', cluster)["num_cpus"] == 2.0
    with pytest.raises(ConfigError, match="cpu_arm"):
        auditor_resources("cpu", "cpu_arm", None, cluster)
    with pytest.raises(ConfigError, match="GPU"):
        auditor_resources("cuda", None, None, cluster)
    with pytest.raises(ConfigError, match="--resources"):
        auditor_resources("cpu", None, "[1]", cluster)


def _fake_run(root: Path, tag: str = "a", n: int = N) -> Path:
    """A hash log of n steps whose chain hashes are derived from `tag` (another tag: another run)."""
    run = root / tag
    run.mkdir()
    lines = []
    for step in range(-1, n):
        h = blake3.blake3(f"{tag}{step}".encode()).hexdigest()
        lines.append(json.dumps({"chain_hash": h, "state_hash": h, "step": step}, sort_keys=True,
                                separators=(",", ":")))
    (run / "hashlog.jsonl").write_text("\n".join(lines) + "\n")
    return run


def _cert(log: RunLog, a: int, b: int, verdict: str = "MATCH", kind: str = "cpu_x86", job: str = "j1",
          bad_step: int | None = None, source: str = "detected") -> dict:
    return {"job_id": job, "run_hash": log.run_hash, "first_step": a, "end_step": b, "start_checkpoint": a,
            "log_digest": log.segment_digest(a, b), "expected_chain": log.chain(b - 1),
            "computed_chain": log.chain(b - 1) if verdict == "MATCH" else "0" * 64, "verdict": verdict,
            "mismatch_step": bad_step, "mismatch_stage": "forward" if bad_step is not None else None,
            "mismatch_detail": "x" if bad_step is not None else None, "steps_replayed": b - a, "kind": kind,
            "kind_source": source, "device": "cpu", "device_name": "test", "backend": "reference",
            "torch_version": "0", "cpu_isa": "x86_64/AVX2", "hostname": "h", "seconds": 1.0, "time": "t"}


def test_certificates_round_trip_and_refuse_overwrite(tmp_path):
    run = _fake_run(tmp_path)
    log = RunLog(run)
    rows = [_cert(log, 0, 4), _cert(log, 4, 8, "MISMATCH", bad_step=5)]
    path = write_certificates(run, "j1", rows)
    assert path == cert_path(run, "j1") and not list(path.parent.glob(".tmp-*"))
    assert read_certificates(path) == rows
    with pytest.raises(CertificateError, match="j1.parquet"):
        write_certificates(run, "j1", rows)


def test_corrupt_certificate_file_is_named(tmp_path):
    run = _fake_run(tmp_path)
    write_certificates(run, "good", [_cert(RunLog(run), 0, 4)])
    cert_path(run, "broken").write_bytes(b"PAR1 not really")
    with pytest.raises(CertificateError, match="broken.parquet"):
        coverage_of(run)


def test_coverage_merges_jobs_and_marks_cross_hardware(tmp_path):
    run = _fake_run(tmp_path)
    log = RunLog(run)
    write_certificates(run, "j1", [_cert(log, 0, 4), _cert(log, 4, 8)])
    cov = coverage_of(run)
    assert cov.verdict == "INCOMPLETE: 8/12 steps certified" and exit_code(cov.verdict) == 3
    assert cov.uncovered_ranges() == [(8, 12)]
    write_certificates(run, "j2", [_cert(log, 8, 12, job="j2"), _cert(log, 4, 8, kind="cpu_arm", job="j2",
                                                                      source="override")])
    cov = coverage_of(run)
    assert cov.verdict == "VERIFIED: every step 0..11 certified MATCH" and exit_code(cov.verdict) == 0
    cross = {(s["first"], s["end"]): s["cross_hardware"] for s in cov.segments()}
    assert cross == {(0, 4): False, (4, 8): True, (8, 12): False}
    assert cov.cross_hardware_steps == 4


def test_mismatch_fails_the_run_and_certifies_the_steps_before_it(tmp_path):
    run = _fake_run(tmp_path)
    log = RunLog(run)
    write_certificates(run, "j1", [_cert(log, 0, 4), _cert(log, 4, 8, "MISMATCH", bad_step=5),
                                   _cert(log, 8, 12)])
    cov = coverage_of(run)
    assert cov.verdict == "FAILED at step 5" and exit_code(cov.verdict) == 1
    assert cov.status["cpu_x86"].tolist() == [1] * 5 + [2] + [0] * 2 + [1] * 4
    png = draw_coverage(cov)
    img = (np.asarray(__import__("matplotlib.image", fromlist=["imread"]).imread(png))[..., :3] * 255).round()
    red = (np.abs(img - [214, 39, 40]).max(axis=-1) < 3).any()
    grey = (np.abs(img - [187, 187, 187]).max(axis=-1) < 3).any()
    assert red and grey, "the map shows the mismatch in red and the uncovered steps in grey"


def _pixels(png: Path, rgb: tuple[int, int, int]) -> int:
    import matplotlib.image

    img = (np.asarray(matplotlib.image.imread(png))[..., :3] * 255).round()
    return int((np.abs(img - rgb).max(axis=-1) < 3).sum())


def test_map_of_a_long_run_shows_short_segments_and_a_one_step_mismatch(tmp_path):
    """200 segments of 10 steps in a 20,000-step run stay green (their boundaries are not drawn where they would
    cover them), and a mismatch of one step is drawn wide enough to see."""
    run = _fake_run(tmp_path, n=20_000)
    log = RunLog(run)
    write_certificates(run, "j1", [_cert(log, a, a + 10) for a in range(0, 2000, 10)]
                       + [_cert(log, 10_000, 10_100, "MISMATCH", bad_step=10_050)])
    png = draw_coverage(coverage_of(run))
    assert _pixels(png, (44, 160, 44)) > 500, "the 2,000 certified steps show green"
    assert _pixels(png, (214, 39, 40)) > 20, "the one mismatched step shows red"


def test_other_runs_and_stale_certificates_are_ignored_with_a_warning(tmp_path):
    run, other = _fake_run(tmp_path, "a"), _fake_run(tmp_path, "b")
    write_certificates(run, "mine", [_cert(RunLog(run), 0, 12)])
    write_certificates(run, "theirs", [_cert(RunLog(other), 0, 12, "MISMATCH", bad_step=3)])
    cov = coverage_of(run)
    assert cov.verdict.startswith("VERIFIED")
    assert len(cov.warnings) == 1 and "theirs.parquet" in cov.warnings[0]
    # an edited line inside a certified segment (here a state hash; the chain is untouched) makes it stale
    lines = (run / "hashlog.jsonl").read_text().splitlines()
    lines[6] = lines[6].replace('"state_hash":"', '"state_hash":"f')
    (run / "hashlog.jsonl").write_text("\n".join(lines) + "\n")
    cov = coverage_of(run)
    assert cov.verdict == "INCOMPLETE: 0/12 steps certified"
    assert any("mine.parquet" in w and "edited" in w for w in cov.warnings)


def _printed(cov) -> str:
    from rich.console import Console

    from replay.coverage import print_coverage

    console = Console(record=True, width=250, color_system=None)
    print_coverage(cov, console)
    return console.export_text()


def _assert_partition(cov) -> None:
    """The table's rows cover 0..N-1 in order, each step once; its uncovered rows are the map's grey ranges."""
    rows = cov.rows()
    assert rows[0]["first"] == 0 and rows[-1]["end"] == cov.n_steps
    assert all(a["end"] == b["first"] and a["first"] < a["end"] for a, b in zip(rows, rows[1:] + [None]) if b)
    assert [(r["first"], r["end"]) for r in rows if not r["covered"]] == cov.uncovered_ranges()


def test_table_rows_partition_the_steps_and_refusals_are_listed_apart(tmp_path):
    run = _fake_run(tmp_path)
    log = RunLog(run)
    why = "CheckpointError: step-000000000004/params.safetensors: blake3 mismatch"
    write_certificates(run, "j1", [_cert(log, 0, 4), _cert(log, 8, 12)])
    # a job that was refused: one segment of the default cut, one whole-run segment over steps others certified
    write_certificates(run, "j2", [{**_cert(log, 4, 8, "REFUSED", job="j2"), "mismatch_detail": why},
                                   {**_cert(log, 0, 12, "REFUSED", job="j2"), "mismatch_detail": why}])
    write_certificates(run, "j3", [_cert(log, 2, 6, kind="cpu_arm", job="j3", source="override")])  # another cut
    write_certificates(run, "j4", [{**_cert(log, 0, 12, "REFUSED", kind="gpu_nvidia", job="j4"),
                                    "mismatch_detail": why}])
    cov = coverage_of(run)
    assert cov.verdict == "INCOMPLETE: 10/12 steps certified"
    _assert_partition(cov)
    assert [(r["first"], r["end"], r["match"], r["jobs"], r["cross_hardware"]) for r in cov.rows()] == [
        (0, 2, ["cpu_x86"], 1, False), (2, 4, ["cpu_arm*", "cpu_x86"], 2, True), (4, 6, ["cpu_arm*"], 1, False),
        (6, 8, [], 0, False), (8, 12, ["cpu_x86"], 1, False)]
    assert [(c["first_step"], c["end_step"], c["kind"]) for c in cov.refused()] == [
        (0, 12, "cpu_x86"), (0, 12, "gpu_nvidia"), (4, 8, "cpu_x86")]
    assert "gpu_nvidia" not in cov.status  # a kind with only refusals has no row on the map

    text = _printed(cov)
    table, _, refused = text.partition("refused: 3 segment(s)")
    assert refused, text
    import re
    ranges = [(int(a), int(b) + 1) for a, b in re.findall(r"^│ (\d+)\.\.(\d+) ", table, flags=re.M)]
    assert ranges == [(r["first"], r["end"]) for r in cov.rows()]  # printed as computed: no overlap
    assert "refused on" not in table and why not in table
    assert [(int(a), int(b) + 1) for a, b in re.findall(r"^│ (\d+)\.\.(\d+) ", refused, flags=re.M)] == [
        (0, 12), (0, 12), (4, 8)]
    assert refused.count("blake3 mismatch") == 3


def test_a_mismatch_row_is_its_step_alone(tmp_path):
    """A MISMATCH certificate certifies its steps before the divergence; the steps after it stay uncovered."""
    run = _fake_run(tmp_path)
    log = RunLog(run)
    write_certificates(run, "j1", [_cert(log, 0, 4), _cert(log, 4, 8, "MISMATCH", bad_step=5), _cert(log, 8, 12)])
    cov = coverage_of(run)
    _assert_partition(cov)
    assert [(r["first"], r["end"], r["match"], r["mismatch"]) for r in cov.rows()] == [
        (0, 4, ["cpu_x86"], []), (4, 5, ["cpu_x86"], []), (5, 6, [], ["cpu_x86"]), (6, 8, [], []),
        (8, 12, ["cpu_x86"], [])]
    assert cov.rows()[2]["first_bad"]["mismatch_step"] == 5 and not cov.refused()


def test_a_sampled_job_records_its_sample_and_coverage_says_what_it_proves(tmp_path):
    """Two sampled jobs over the 6 two-step segments: each file holds its draw, coverage merges their certificates
    and states what each sample proves; the site's overview says the same and reproduces each job's command."""
    from replay.certificates import read_sample
    from replay.sampling import draw, miss_probability, percent
    from replay.site import commands, pages
    from replay.site.view import RunView

    run = _fake_run(tmp_path)
    log = RunLog(run)
    population = plan_segments(0, N, 2, [])
    jobs = {}
    for job, seed in (("j1", 3), ("j2", 8)):
        sample = draw(population, 0.5, seed, log.run_hash)
        path = write_certificates(run, job, [_cert(log, a, b, job=job) for a, b in sample.drawn], sample)
        assert read_sample(path) == sample and [(r["first_step"], r["end_step"]) for r in read_certificates(path)] \
            == list(sample.drawn)
        jobs[job] = sample
    assert jobs["j1"].drawn != jobs["j2"].drawn, "two seeds, two draws"
    write_certificates(run, "full", [_cert(log, 0, 2, job="full")])
    assert read_sample(cert_path(run, "full")) is None, "a file without a sample: a full or explicit audit"

    cov = coverage_of(run)
    steps = {s for sample in jobs.values() for a, b in sample.drawn for s in range(a, b)} | {0, 1}
    assert cov.verdict == f"INCOMPLETE: {len(steps)}/{N} steps certified" and set(cov.samples) == {"j1.parquet",
                                                                                                   "j2.parquet"}
    one = percent(miss_probability(6, 3, 1))
    assert one == "50.0%"  # 3 of 6 undrawn
    lines = cov.sample_statements()
    assert [ln.split(":")[0] for ln in lines] == ["sampled 3 of 6 segments (steps 0..11, seed 3)",
                                                  "sampled 3 of 6 segments (steps 0..11, seed 8)"]
    assert all(f"misses it with probability {one}" in ln for ln in lines)
    text = _printed(cov)
    assert all(ln in text.replace("\n", "") for ln in lines), text

    view = RunView(run, log, None, None, cov, [], [])  # the coverage section reads only the coverage
    html = pages.coverage_section(view)
    assert all(f'<p class="sample">{ln}</p>' in html for ln in lines)
    cmds = {j["job"]: j["command"] for j in commands.job_commands(cov.certs, str(run), cov.samples)}
    assert cmds["j2"].endswith("--steps 0:12 --segment 2 --sample 0.5 --seed 8") and "--sample" not in cmds["full"]


def test_a_hand_picked_or_refused_sample_proves_less(tmp_path):
    from replay.sampling import Sample, draw

    run = _fake_run(tmp_path)
    log = RunLog(run)
    population = tuple(plan_segments(0, N, 2, []))
    drawn = draw(population, 0.5, 1, log.run_hash)
    a, b = drawn.drawn[0]
    write_certificates(run, "j1", [_cert(log, *s) for s in drawn.drawn[1:]] + [_cert(log, a, b, "REFUSED")], drawn)
    picked = Sample(population, 0.5, 1, population[:3])
    assert picked.drawn != drawn.drawn
    write_certificates(run, "j2", [_cert(log, *s, job="j2") for s in picked.drawn], picked)
    cov = coverage_of(run)
    assert list(cov.samples) == ["j1.parquet"]
    assert any("j2.parquet" in w and "not the draw of seed 1" in w for w in cov.warnings)
    [line] = cov.sample_statements()
    assert "sampled 3 of 6 segments" in line and "2 certified (1 refused or stale: not counted)" in line
    assert "misses it with probability 66.7%" in line  # 4 of 6 segments not certified


def test_certificates_of_a_run_audited_while_it_trained_stay_valid(tmp_path):
    """A certificate written against the log's first 8 steps vouches for them once the run has gone on: its run
    hash is the chain hash after step 7 of the longer log. One whose segment ends after the step its run hash
    names, or whose run hash the log does not hold, does not."""
    run = _fake_run(tmp_path, "a")
    full = RunLog(run)
    (tmp_path / "then").mkdir()
    prefix = RunLog(_fake_run(tmp_path / "then", "a", n=8))  # the log as it stood after step 7
    assert prefix.run_hash == full.chain(7)
    write_certificates(run, "early", [_cert(prefix, 0, 8)])
    write_certificates(run, "late", [_cert(full, 8, N)])
    cov = coverage_of(run)
    assert cov.verdict.startswith("VERIFIED") and not cov.warnings, (cov.verdict, cov.warnings)
    assert full.extends(full.chain(3), 4) and not full.extends(full.chain(3), 5)
    assert not full.extends(RunLog(_fake_run(tmp_path, "b")).run_hash, 1)
