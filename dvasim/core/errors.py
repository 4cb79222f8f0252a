"""The mechanism's errors, in a module of their own so that the compiled core (``make compiled``: mypyc, which
cannot compile a subclass of ``RuntimeError``) leaves them ordinary Python classes. Each is re-exported by the
module that raises it (``dvasim.core.batch_table.MetaOpError`` and so on)."""


class MetaOpError(RuntimeError):
    """A policy asked for a meta operation that the batch table does not allow."""


class TransitionError(RuntimeError):
    """A transition that Figure 11 does not have."""


class PolicyError(RuntimeError):
    """A policy returned an operation the mechanism cannot carry out."""
