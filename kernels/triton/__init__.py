"""kernels/triton package."""
