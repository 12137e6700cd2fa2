"""ARVQ (the ARVQ write-up): 2-bit additive residual vector quantization of an MoE's cold experts.

format (rvq256_256x8) + fp_formats (FP4/E4M3) + packing (index tiles) + store (on-disk layout);
capture / synthetic (activations) -> hessian -> codebook (EM) -> ldlq (sweep) -> scales (refit), composed
by fit; baselines (RTN/GPTQ 2-bit), metrics, saliency (hot/cold split), pipeline (`python -m app quant fit`).
Part 2: donor (the trained MoE) -> objective (reference / same_input) -> student (latents, BR decode) -> pv
(+ reassign) -> layer (fit, baselines, gates, export) -> sequential (`python -m app quant run`: rolling cache,
publish, resume); expert_sum + gang (Ray actors, exact coupled sum); calib (calibration corpus); acceptance.
"""
