"""Expert-sharded gangs: N = 2, 4 Ray actors publish the in-process bits, N = 1 and 2 the same files for a
Hugging Face model; a member lost mid-layer fails that layer cleanly and a rerun resumes it to the same bits."""
import pytest

from quant import sequential
from quant.gang import GangError
from quant.store import read_manifest

from .conftest import small_spec

ray = pytest.importorskip("ray")
COLD = {0: [0, 1, 2]}


def _digests(out):
    rec = read_manifest(out)["layers"]["0"]
    d = {p: v["blake3"] for p, v in rec["projections"].items()}
    d["latents"] = rec["meta"]["tuned_latents_blake3"]  # float latents after Adam: every bit of the tuning
    return d


def test_gang_sizes_give_identical_tuned_weights(ray_session, tiny_donor, tiny_data, tmp_path):
    runs = {}
    # 0: in process; 4 members for 3 experts: one owns none and still joins every sum (a gang of 1: the
    # Hugging Face test below)
    for n in (0, 2, 4):
        out = tmp_path / f"gang{n}"
        sequential.run(small_spec(out, gang=n), donor=tiny_donor, data=tiny_data, cold=COLD)
        runs[n] = _digests(out)
    assert runs[2] == runs[0] and runs[4] == runs[0]
    assert read_manifest(tmp_path / "gang2")["layers"]["0"]["meta"]["reassign"][0]["proposed"] > 0


def test_lost_member_fails_the_layer_and_a_rerun_resumes_it(ray_session, tiny_donor, tiny_data, tmp_path):
    clean = tmp_path / "clean"
    sequential.run(small_spec(clean), donor=tiny_donor, data=tiny_data, cold=COLD)
    out = tmp_path / "crash"
    with pytest.raises(GangError, match="layer 0: gang member 1 of 2 failed"):
        sequential.run(small_spec(out, gang=2, crash=(0, 1, 3)), donor=tiny_donor, data=tiny_data, cold=COLD)
    assert read_manifest(out)["layers"] == {}
    sequential.run(small_spec(out, gang=2), donor=tiny_donor, data=tiny_data, cold=COLD)
    assert _digests(out) == _digests(clean)


def test_gang_sizes_publish_identical_files_for_a_hugging_face_model(ray_session, hf_donor, hf_data, tmp_path):
    from .conftest import hf_spec
    donor = hf_donor("tiny-qwen2-moe")
    runs = {}
    for n in (1, 2):
        out = tmp_path / f"gang{n}"
        sequential.run(hf_spec("tiny-qwen2-moe", out, updates=2, layers=(0,), gang=n), donor=donor, data=hf_data)
        runs[n] = _digests(out)
    assert runs[1] == runs[2]
