"""Canonical bitwise-reproducible op definitions (eager PyTorch, BR-safe primitives only)."""
