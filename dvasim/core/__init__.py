"""DVABatch's mechanism as plain Python objects: queries, the batch table and its meta operations, batch queue
items, buffer pairs, stage executors and the pipeline control plane. Imports neither simpy nor torch."""

from dvasim.core.batch_table import Batch, BatchItem, BatchTable, MetaOpError
from dvasim.core.buffers import BufferPairs, BufferState
from dvasim.core.executor import Executor, ExecutorState, TransitionError
from dvasim.core.pipeline import Execution, Pipeline, PolicyError
from dvasim.core.query import Query

__all__ = [
    "Batch", "BatchItem", "BatchTable", "BufferPairs", "BufferState", "Execution", "Executor", "ExecutorState",
    "MetaOpError", "Pipeline", "PolicyError", "Query", "TransitionError",
]
