"""Writes the tiny Hugging Face MoE checkpoints the quant tests read (committed next to this file):

    tests/quant/hf_models/tiny-mixtral/     Mixtral layout (experts w1/w2/w3), 2 layers, 4 experts, top-2
    tests/quant/hf_models/tiny-qwen2-moe/   Qwen2-MoE layout (gate/up/down_proj, a gated shared expert)

Each is built by `transformers` from a config (no download), trained for 300 steps on the demo corpus's
calibration training windows (quant.calib: the held-out documents never enter), read with a 512-token BPE
tokenizer trained here on the same corpus, and saved by save_pretrained (bfloat16, two or more shards
with their index, config.json, tokenizer.json): about 1.3 MB each. Rerun after changing the recipe:

    PYTHONPATH=. .venv/bin/python tests/quant/hf_models/build.py --corpus data/demo
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).parent
VOCAB = 512
COMMON = dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=128, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0)
MODELS = {
    "tiny-mixtral": ("MixtralConfig", "MixtralForCausalLM",
                     dict(intermediate_size=128, num_local_experts=4, num_experts_per_tok=2)),
    "tiny-qwen2-moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                       dict(intermediate_size=128, moe_intermediate_size=128, shared_expert_intermediate_size=128,
                            num_experts=4, num_experts_per_tok=2, norm_topk_prob=False)),
}
STEPS, BATCH, LR, SEED = 300, 16, 3e-3, 0


def tokenizer(corpus: Path, path: Path) -> None:
    """A 512-token byte-level BPE on the corpus's documents (separator id 0), written to `path`."""
    import json
    from stream.readers import read_documents
    from stream.tokenizer import TokenizerConfig, train_tokenizer
    manifest = json.loads((corpus / "manifest.json").read_text())
    docs = [d for s in manifest["sources"] for sh in s["shards"]
            for d in read_documents(corpus / sh["path"], s.get("text_column", "text")).texts]
    train_tokenizer(docs, path, TokenizerConfig(vocab_size=VOCAB))


def train(name: str, windows: torch.Tensor, tok: Path, out: Path) -> None:
    import transformers
    cfg_cls, model_cls, extra = MODELS[name]
    torch.manual_seed(SEED)
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**COMMON, **extra))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    g = torch.Generator().manual_seed(SEED)
    model.train()
    for step in range(STEPS):
        ids = windows[torch.randint(0, windows.shape[0], (BATCH,), generator=g)]
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == STEPS - 1:
            print(f"{name} step {step} loss {loss.item():.3f}", flush=True)
    model = model.eval().to(torch.bfloat16)
    with tempfile.TemporaryDirectory(dir=HERE) as tmp:
        model.save_pretrained(tmp, max_shard_size="700KB")
        shutil.copy(tok, Path(tmp) / "tokenizer.json")
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(tmp, out)
    out.chmod(0o755)
    for f in out.iterdir():
        f.chmod(0o644)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="data/demo", help="a corpus directory the stream wrote (data build-demo)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated names (default: all)")
    a = ap.parse_args()
    from quant.calib import CalibConfig, build
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        tok = Path(tmp) / "tokenizer.json"
        tokenizer(Path(a.corpus), tok)
        windows = build(CalibConfig(corpus=a.corpus, train=4000, val=1, audit=1), tokenizer=tok,
                        separator=0)["train"]
        for name in a.models.split(","):
            train(name, windows, tok, HERE / name)


if __name__ == "__main__":
    main()
