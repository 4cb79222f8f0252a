"""DVABatch's mechanism as plain Python objects (paper §5-§6): queries, the batch table and its meta operations
(:mod:`~dvasim.core.operations`: *new*, *stretch*, *split*), batch queue items, buffer pairs, stage executors with
their four states, and the pipeline control plane both engines drive.

May import: the foundation (:mod:`dvasim.errors`) and the standard library; neither simpy nor torch, and no other
dvasim package (the policies are handed in; tests/test_layout.py enforces it).
"""

from dvasim.core.batch_table import Batch, BatchItem, BatchTable, MetaOpError
from dvasim.core.buffers import BufferPairs, BufferState
from dvasim.core.executor import Executor, ExecutorState, TransitionError
from dvasim.core.pipeline import Execution, Pipeline, PolicyError
from dvasim.core.query import Query

__all__ = [
    "Batch", "BatchItem", "BatchTable", "BufferPairs", "BufferState", "Execution", "Executor", "ExecutorState",
    "MetaOpError", "Pipeline", "PolicyError", "Query", "TransitionError",
]
