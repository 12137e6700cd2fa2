"""Named configs as data: `tiny` (CI on 2 cores), `small` (~100M), `small-parity` (small's shape, a batch a CPU
can replay for 100+ steps), `tiny-moe` (routed experts + a shared expert), `open-1b` (the report's shape)."""
from __future__ import annotations

from training.config import ModelConfig, MoEConfig, RunConfig, TrainConfig
from training.errors import ConfigError

# tiny: 2 layers, d 128, GQA 4/2 x 32, FFN 352 (2.75 d), the demo tokenizer's 4096 tokens, 64-token windows.
# Layer 0 slides a 32-token window, layer 1 (the last) is global. The batch ramps from 2 windows per step
# to 4 after 8,192 tokens (step 64), microbatches of 2 windows (accumulation 1, then 2, on one rank);
# the LR warms up over 20 steps and anneals to 10% by ~step 200. Held-out: 32 windows, every 25th from 6000.
TINY = RunConfig(
    "tiny",
    ModelConfig(vocab_size=4096, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, ffn_hidden=352,
                seq_len=64, window=32),
    TrainConfig(batch_phases=((8_192, 2), (1 << 50, 4)), micro_batch=2, lr_peak=1e-3, lr_warmup_tokens=2_560,
                lr_budget_tokens=45_000, heldout_window=6000, heldout_windows=32, heldout_stride=25))

# small: 14 layers, d 768, GQA 6/2 x 128, FFN 2112 (2.75 d), vocab 4096: 96.5M parameters. Held-out: 16 windows
# from window 320,000, past the LR budget's 20,000 steps of 16 windows, so that a run can train its whole
# schedule; the stream's epochs repeat a small corpus such as data/demo (~3,500 windows of 256 tokens).
SMALL = RunConfig(
    "small",
    ModelConfig(vocab_size=4096, d_model=768, n_layers=14, n_heads=6, n_kv_heads=2, head_dim=128, ffn_hidden=2112,
                seq_len=256, window=128),
    TrainConfig(batch_phases=((1 << 50, 16),), micro_batch=4, lr_peak=1e-3, lr_warmup_tokens=200 * 16 * 256,
                lr_budget_tokens=20_000 * 16 * 256, heldout_window=20_000 * 16, heldout_windows=16))

# small's shape at 2 windows of 64 tokens per step: what the GPU parity check replays on a CPU. Two windows give
# pre-clip norms of 5-12, over the 5.0 spike threshold that a real batch is calibrated for: at 5.0 the spike
# protocol skipped 98 of 100 optimizer steps and the check hardly ran AdamW, so this preset arms it at 50
# (a non-finite norm still triggers; the protocol's own path is checked in tests/training/test_step.py).
SMALL_PARITY = RunConfig(
    "small-parity",
    ModelConfig(vocab_size=4096, d_model=768, n_layers=14, n_heads=6, n_kv_heads=2, head_dim=128, ffn_hidden=2112,
                seq_len=64, window=32),
    TrainConfig(batch_phases=((1 << 50, 2),), micro_batch=1, lr_peak=1e-3, lr_warmup_tokens=20 * 128,
                lr_budget_tokens=1000 * 128, heldout_window=6000, heldout_windows=0, spike_threshold=50.0))

TINY_MOE = RunConfig(
    "tiny-moe",
    ModelConfig(vocab_size=4096, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, ffn_hidden=352,
                seq_len=64, window=32, moe=MoEConfig(n_experts=4, top_k=2, expert_ffn=128, shared_ffn=128)),
    TINY.train)

OPEN_1B = RunConfig("open-1b", ModelConfig(), TrainConfig(corpus="data/open-1b"))

PRESETS = {c.name: c for c in (TINY, SMALL, SMALL_PARITY, TINY_MOE, OPEN_1B)}


def preset(name: str) -> RunConfig:
    """The named config; ConfigError lists the names."""
    if name not in PRESETS:
        raise ConfigError(f"--config: expected one of {sorted(PRESETS)}, got {name!r}")
    return PRESETS[name]


def run_config(name: str, micro_batch: int | None = None, corpus: str | None = None,
               reduction: str | None = None) -> RunConfig:
    """The named preset with the command line's overrides (None: the preset's own value)."""
    cfg = preset(name)
    given = {"train.micro_batch": micro_batch, "train.corpus": corpus, "train.reduction": reduction}
    return cfg.replace(**{k: v for k, v in given.items() if v is not None})
