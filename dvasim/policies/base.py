"""The policy interface shared by every engine, and the registry of policies by name.

A policy decides the meta operations; the engine (the SimPy simulator or the real replay) carries them out. A policy
sees the pipeline only through a :class:`PipelineView` (the time now, the batch table, the latency profile, queue
lengths) and answers with operations:

* :meth:`Policy.admit` -- called at the front door whenever something changed: returns :class:`New` and
  :class:`Stretch` operations for pending queries;
* :meth:`Policy.at_boundary` -- called by a stage executor when a batch has completed a stage (paper Figure 12,
  ``Schedule``): may return a :class:`Split`, a :class:`Stretch`, or a :class:`New` of the batch's own queries
  (*new* at a stage boundary: the batch continues as a fresh row of the batch table, the latest one, so that
  later queries may stretch it; what a LazyBatching-style preemption needs);
* :meth:`Policy.next_wakeup` -- the next time the front door wants to be asked again (e.g. a batch window closes);
* :meth:`Policy.lane_batch_sizes` -- optional: the only batch sizes it forms on a lane (E2bird's workers), so an
  engine that prepares per batch size (the replay's CUDA graphs) prepares no others.

Nothing here imports simpy or torch.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from dvasim.core.compiling import mypyc_attr
from dvasim.core.operations import SPLIT_MANNERS, New, Split, Stretch, time_eps  # noqa: F401  (policies use them)
from dvasim.errors import ConfigError

if TYPE_CHECKING:
    from dvasim.core.batch_table import Batch, BatchTable
    from dvasim.core.query import Query


# ----------------------------------------------------------------------------- what a policy sees
class Profile(Protocol):
    """The latency profile a policy may consult (a :class:`dvasim.model.table.LatencyTable` or a stage view)."""

    n_stages: int
    max_batch_size: int

    def latency(self, stage: int, batch_size: int, seq_len: int | None = None) -> float: ...

    def remaining(self, from_stage: int, batch_size: int, seq_len: int | None = None) -> float: ...


class PipelineView(Protocol):
    n_stages: int
    table: BatchTable
    profile: Profile
    qos_target_ms: float | None  # the service's latency target, when the engine knows it
    input_lengths: Any  # a sample of the service's input lengths (a sequence), or None when unknown

    def now(self) -> float: ...

    def queue_length(self, stage: int) -> int: ...

    def stage_idle(self, stage: int) -> bool: ...

    def active_queries(self) -> int: ...

    def free_instances(self) -> int: ...

    def free_lane_indices(self) -> list[int]: ...  # the instances that hold no batch, by index


# ----------------------------------------------------------------------------- base class and registry
_REGISTRY: dict[str, type[Policy]] = {}


_ALIASES: dict[str, str] = {}  # alias -> name


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name`` (and by each of its ``aliases``)."""
    _REGISTRY[cls.name] = cls
    for alias in cls.aliases:
        _ALIASES[alias] = cls.name
    return cls


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def canonical_name(name: str) -> str:
    """The registered name of ``name`` (itself, or the policy it is an alias of)."""
    return _ALIASES.get(name, name)


def policy_reference(name: str) -> dict[str, Any]:
    """What a user needs to configure policy ``name``: its summary (the docstring's first paragraph), aliases,
    and each parameter with its help and default (``None``: derived at run time, see the help)."""
    import inspect

    import dvasim.policies  # noqa: F401  (registers the built-in policies)

    cls = _REGISTRY[canonical_name(name)]
    sig = inspect.signature(cls)  # (a compiled class's __init__ has no signature of its own; the class has)
    params = {}
    for key, help_ in cls.params.items():
        p = sig.parameters.get(key)
        default = None if p is None or p.default is inspect.Parameter.empty else p.default
        params[key] = {"help": help_, "default": default}
    own = next((c for c in cls.__mro__ if _own_doc(c) and c.__dict__.get("name")), cls)
    doc = inspect.cleandoc(_own_doc(own))
    return {"name": cls.name, "aliases": list(cls.aliases), "summary": " ".join(doc.split("\n\n")[0].split()),
            "params": params}


def _own_doc(cls: type) -> str:
    """``cls``'s own docstring. mypyc keeps none of a compiled class (:mod:`dvasim.compiled`), only its signature:
    then it is read from the class's source, the ``.py`` file beside the compiled module."""
    import ast
    import sys
    from pathlib import Path

    doc = cls.__dict__.get("__doc__") or ""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None) or ""
    if doc or not path or path.endswith(".py"):
        return doc
    source = Path(path).with_name(cls.__module__.rpartition(".")[2] + ".py")
    if not source.is_file():
        return ""
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return ast.get_docstring(node, clean=False) or ""
    return ""


def make_policy(name: str, params: dict[str, Any] | None = None) -> Policy:
    """Instantiate the policy registered as ``name`` with ``params`` (checked against its declared parameters)."""
    import dvasim.policies  # noqa: F401  (registers the built-in policies)

    name = canonical_name(name)
    if name not in _REGISTRY:
        raise ConfigError("policy.name", f"unknown policy {name!r}; allowed: {', '.join(policy_names())}")
    cls = _REGISTRY[name]
    params = dict(params or {})
    unknown = sorted(set(params) - set(cls.params))
    if unknown:
        raise ConfigError(
            f"policy.{unknown[0]}",
            f"unknown parameter for policy {name!r}; allowed: {', '.join(sorted(cls.params))}",
        )
    return cls(**params)


@mypyc_attr(allow_interpreted_subclasses=True)
class Policy(ABC):
    """Base class. Subclasses set ``name``, ``params`` (name -> help) and implement :meth:`admit`."""

    name: ClassVar[str] = "base"
    aliases: ClassVar[tuple[str, ...]] = ()  # other names it answers to in a config
    params: ClassVar[dict[str, str]] = {}

    # whether the policy decides anything at a stage boundary (it overrides :meth:`at_boundary`); a pipeline
    # does not ask one that does not
    decides_at_boundary: ClassVar[bool] = False

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.decides_at_boundary = cls.at_boundary is not Policy.at_boundary

    def __init__(self) -> None:
        self.pending: deque[Query] = deque()
        self.view: PipelineView | None = None

    def bind(self, view: PipelineView) -> None:
        """Called once by the engine before the run; validate against the profile here."""
        self.view = view

    def on_arrival(self, query: Query) -> None:
        self.pending.append(query)

    @abstractmethod
    def admit(self, now: float) -> list[New | Stretch]:
        """Form batches from pending queries (the front door)."""

    def at_boundary(self, batch: Batch, stage: int, now: float) -> Split | Stretch | None:
        """Called after ``batch`` completed ``stage`` (all its queries, before handing them on)."""
        return None

    def next_wakeup(self, now: float) -> float:
        """The next time :meth:`admit` must be called even if nothing else happens (``inf`` if never)."""
        return math.inf

    def has_pending(self) -> bool:
        """Whether :meth:`admit` and :meth:`next_wakeup` may have anything to say now. The engines ask neither
        while it is False (their answers would be no operation and ``inf``). True here, so a policy is always
        asked; a policy whose front door acts only on waiting queries answers whether any wait
        (:class:`FrontDoorPolicy`)."""
        return True

    def lane_batch_sizes(self, lane: int) -> list[int] | None:
        """The batch sizes (rows run) this policy can ever form on lane ``lane`` (model instance), or None: any
        size up to its largest. Asked after the pipeline is built; an engine that prepares per batch size (the
        replay's CUDA graphs and warm-up passes) prepares only these, so a policy that answers must never form
        another size on that lane (the replay then stops with an error naming the stage and the shape)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **{k: getattr(self, k) for k in self.params if hasattr(self, k)}}

    # helpers for subclasses
    def take(self, n: int) -> list[Query]:
        return [self.pending.popleft() for _ in range(min(n, len(self.pending)))]


@mypyc_attr(allow_interpreted_subclasses=True)
class FrontDoorPolicy(Policy):
    """A policy whose front door acts only on waiting queries (``pending``): with none waiting, :meth:`admit`
    forms nothing and :meth:`next_wakeup` is ``inf``, so the engines do not ask."""

    def has_pending(self) -> bool:
        return bool(self.pending)


def check_positive_int(field: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(field, f"must be an integer >= {minimum}, got {value!r}")
    return value


def check_nonneg_number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(field, f"must be a number >= 0, got {value!r}")
    return float(value)
