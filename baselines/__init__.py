"""Baseline allocators (import only the core): uniform GRPO groups, PCL, random tree.

They satisfy ``trace_gym.allocation.RootAllocator`` / ``PrefixAllocator``; the
strategies built from them are named in ``trace_gym.strategies.STRATEGIES``.
"""

from baselines.pcl import PCLRootAllocator
from baselines.random_tree import RandomPrefixAllocator
from baselines.uniform import UniformRootAllocator, fixed_groups

__all__ = ["PCLRootAllocator", "RandomPrefixAllocator", "UniformRootAllocator", "fixed_groups"]
