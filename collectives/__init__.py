"""Deterministic collectives: TreeFold, the recursive-doubling all-reduce, reduce-scatter/all-gather, the group.

Imports none of the project's other packages (docs/architecture.md, Layering): the few float adds here are
plain elementwise torch `+` in a fixed order, which is BR-safe.
"""
from .allreduce import all_reduce_, simulate_allreduce
from .average import average_, reciprocal
from .group import CollectiveGroup, free_port
from .reduce_scatter import (all_gather, ascending_sum, gather, reduce_scatter, shard_bounds, simulate_all_gather,
                             simulate_reduce_scatter)
from .schedule import allreduce_schedule, blocks
from .treefold import TreeFold, canonical_tree, treefold

__all__ = ["TreeFold", "treefold", "canonical_tree", "simulate_allreduce", "all_reduce_", "allreduce_schedule",
           "blocks", "simulate_reduce_scatter", "simulate_all_gather", "reduce_scatter", "all_gather", "gather",
           "shard_bounds", "ascending_sum", "average_", "reciprocal", "CollectiveGroup", "free_port"]
