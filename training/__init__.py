"""The training library: the OPEN-1B model and MoE from kernels ops, the one step function, the exact reduction,
HSDP sharding, the state hash chain, checkpoints, the single-process and Ray Train trainers."""
