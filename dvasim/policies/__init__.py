"""Batching policies, shared by every engine. Importing this package registers the built-in ones."""

from dvasim.policies import dvabatch, e2bird, lazybatch, peers, triton  # noqa: F401
from dvasim.policies.base import New, Policy, Split, Stretch, make_policy, policy_names, register

__all__ = ["New", "Policy", "Split", "Stretch", "make_policy", "policy_names", "register"]
