"""`python -m app quant fit` on the synthetic MoE: a verified packed export and a summary."""
import json

from app.cli import main
from quant.format import decode
from quant.store import load_layer, read_manifest


def test_quant_fit_cli_synthetic(tmp_path, capsys):
    out = tmp_path / "arvq"
    rc = main(["quant", "fit", "--model", "synthetic:5", "--layers", "1-2", "--out", str(out), "--experts", "4",
               "--hidden", "128", "--ffn", "128", "--tokens", "1024", "--sample-groups", "1000", "--hot-count",
               "2", "--no-compare"])
    assert rc == 0
    m = read_manifest(out)
    assert sorted(m["layers"]) == ["1", "2"]
    hot = {int(k): v["meta"]["hot"] for k, v in m["layers"].items()}
    assert sum(len(v) for v in hot.values()) == 2
    for layer in (1, 2):
        projs = load_layer(out, layer)
        assert set(projs) == {"w13", "w2"}
        cold = m["layers"][str(layer)]["meta"]["cold"]
        assert list(projs["w13"].experts) == cold and projs["w13"].shape == (256, 128)
        assert projs["w2"].shape == (128, 128) and decode(projs["w2"], 0).isfinite().all()
    events = [json.loads(ln)["event"] for ln in (out / "fit_log.jsonl").read_text().splitlines()]
    assert events[0] == "start" and events[-1] == "done" and "expert_fit" in events
    assert "ARVQ initial fit" in capsys.readouterr().out


def test_quant_run_parses_and_refuses_a_run_without_checkpoints(tmp_path, capsys):
    from app.cli import build_parser
    a = build_parser().parse_args(["quant", "run", "--model", "runs/x", "--out", "o", "--gang", "2", "--layers",
                                   "0-1", "--target", "same_input", "--emulate"])
    # an option left unset stays None: its default is PVConfig's, stated there only
    assert (a.quant_cmd, a.gang, a.layers, a.target, a.emulate, a.updates) == ("run", 2, "0-1", "same_input", True, None)
    (tmp_path / "run").mkdir()
    assert main(["quant", "run", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "o")]) == 2
    assert "no checkpoints" in capsys.readouterr().err
