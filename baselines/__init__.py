"""Baseline allocators and strategies (import only the core).

One-shot allocators (``trace_gym.allocation.allocators.RootAllocator`` / ``PrefixAllocator``): uniform
GRPO groups, PCL, random tree. The zoo, published rollout-allocation methods as wave
strategies (``trace_gym.allocation.waves.WaveStrategy``), one module each with its paper cited: DAPO
dynamic sampling, GRESO, MoPPS, Knapsack RL, Pilot-Commit, AR3PO, CERO; and their own
predictors (``baselines.predictors``). The strategies built from them are named in
``trace_gym.strategies.STRATEGIES``.
"""

from baselines.ar3po import AR3PO
from baselines.cero import CERO
from baselines.dapo import DAPODynamicSampling
from baselines.greso import GRESO
from baselines.knapsack import KnapsackRL
from baselines.mopps import MoPPS
from baselines.pcl import PCLRootAllocator
from baselines.pilot_commit import PilotCommit
from baselines.predictors import BetaPosteriorPredictor, RunningRatePredictor
from baselines.random_tree import RandomPrefixAllocator
from baselines.uniform import UniformRootAllocator, fixed_groups

__all__ = ["AR3PO", "BetaPosteriorPredictor", "CERO", "DAPODynamicSampling", "GRESO", "KnapsackRL", "MoPPS",
           "PCLRootAllocator", "PilotCommit", "RandomPrefixAllocator", "RunningRatePredictor",
           "UniformRootAllocator", "fixed_groups"]
