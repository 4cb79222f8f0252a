"""Batching policies, shared by every engine: each decides the meta operations the mechanism carries out
(:mod:`~dvasim.policies.base`: the interface and the registry; DVABatch, DelayBatch/ZeroBatch, LazyBatching,
E2bird's N-/E-Ebird, TF-Serving's and Triton's batchers). Importing this package registers the built-in ones.

May import: the mechanism (:mod:`dvasim.core`), the foundation and the standard library; neither simpy nor torch.
What a policy needs from an engine (E-Ebird's co-run profile) is handed to it.
"""

from dvasim.policies import dvabatch, dvabatch_built, e2bird, lazybatch, peers, triton, triton_server  # noqa: F401
from dvasim.policies.base import New, Policy, Split, Stretch, make_policy, policy_names, register

__all__ = ["New", "Policy", "Split", "Stretch", "make_policy", "policy_names", "register"]
