"""Fast Triton twins of kernels/ref ops: same names, same signatures, the reference's bits on CUDA.

Each twin module mirrors its kernels/ref module; names without a twin resolve to the reference's.
Importing a twin module needs triton; `kernels.backend("triton")` imports them lazily.
"""

# kernels/ref modules that have a Triton twin module here
TWINS = ("adamw", "attention", "contraction", "elementary", "embedding", "hadamard", "int8_linear", "intmm", "loss",
         "reduce", "rmsnorm", "rope", "rotated_mm", "softmax", "swiglu")
