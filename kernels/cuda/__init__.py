"""CUDA kernels that the Triton backend launches where Triton 3.6 lacks the primitive (warp shuffles).

Each gives the bits of its Triton twin and of kernels/ref; each is optional: with no NVRTC, or with
BR_CUDA_KERNELS=0, the Triton kernel runs instead, bit for bit the same (tests/gpu/test_cuda_rotate.py).
"""
