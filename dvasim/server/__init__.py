"""The server around the GPU: serving-stack models (``[server] stack = ...``).

A serving stack is what a real server pays beside the GPU's own time, and what every batching trade-off is made
against:

* per batch (:mod:`dvasim.server.costs`): request handling and the scheduler's wake-up, the inputs gathered and
  concatenated on the host (per row and per byte), the host-to-device copy at pinned or pageable bandwidth, and the
  device-to-host copy with its synchronisation;
* per stage launch: the host's launching cost by module kind, as a law in the stage's operators and the batch size
  (so one description fits any slicing), run on the host's launching cores, its Python-level part under one
  interpreter lock (:mod:`dvasim.server.host`);
* whether a batch thread leaves the GPU idle between its batches (it synchronises and answers before it takes the
  next), and a co-run penalty for concurrent workers where a source shows one.

:mod:`dvasim.server.stacks` holds the named stacks, every number with its provenance; :mod:`dvasim.server.resolve`
picks a run's stack (named in the config, else the one its table's source implies) and builds what the engine
needs from it. May import: the foundation (the schema its sections are declared in), :mod:`dvasim.core.arith` (the
clock path's sums), model data (tables, the named models) and the standard library.
"""

from dvasim.server.stacks import STACKS, ServingStack

__all__ = ["STACKS", "ServingStack"]
