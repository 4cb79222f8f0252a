"""Host-to-GPU input transfers (``[engine.transfer]``): E2bird's GPU-resident memory pool, or TF-Serving's copy of
a batch's inputs when the batch is launched (Cui et al., E2bird, TPDS'21, §3.2 and §5).

``[engine.transfer]`` keys (the whole table is optional; absent = ``mode = "none"``, no transfer modelled, which
is what every run did before this model existed):

==================  =============================================================================================
mode                ``"none"`` | ``"pool"`` | ``"on_launch"``
input_bytes         bytes of one query's input (default 602112: a 3x224x224 float32 image)
input_bytes_per_token  more bytes per token of the query's length (tables with a ``seq_len``; default 0)
bandwidth_gbps      effective host-to-device bandwidth in GB/s (1 GB = 1e9 bytes; default 12: PCIe 3.0 x16 with
                    pinned memory)
==================  =============================================================================================

* ``"pool"`` (E2bird §5.1): every query's input is copied to the GPU as soon as it arrives, one copy at a time in
  arrival order (``InMutex``), overlapping the computation; the front door (the policy) sees a query only when its
  copy is done. The copy of query ``k`` takes ``x_k = bytes_k / bandwidth`` and starts when the query reaches the
  front door (its arrival plus any ``admission_delay_ms``) or when the previous copy ends, whichever is later:
  ``visible_k = max(door_k, visible_{k-1}) + x_k`` (a FIFO queue on the link, Lindley's recursion).
* ``"on_launch"`` (TF-Serving, E2bird §3.2 and Figure 3): a batch's inputs are copied together when the batch is
  launched, before its first stage computes; the copy does not overlap that batch's computation (the instance waits
  for it; the GPU is idle unless another instance computes). The copy takes ``rows * bytes / bandwidth``, where a
  policy that pads batches (``tfserving-static``) copies the padded rows, and copies of different instances share
  the one link one at a time.

Not modelled (assumed negligible, and said so): the output copy back to the host (a classifier's 1000 scores are
4 KB, 0.3 us at 12 GB/s), the per-copy fixed cost (E2bird §5.3 measured 3.9 us per request), and PCIe
contention between input copies and anything else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dvasim.schema import MAX_BYTES, Key, Section

MODES = ("none", "pool", "on_launch")
IMAGE_BYTES = 3 * 224 * 224 * 4  # one 224x224 RGB image in float32
TRANSFER = Section("engine.transfer", "host-to-GPU input copies (E2bird's memory pool, TF-Serving's copy at launch)", (
    Key("mode", "choice", '"none" (no transfer modelled), "pool" (E2bird\'s memory pool) or "on_launch" (TF-Serving)',
        default="none", choices=MODES),
    Key("input_bytes", "number", "bytes of one query's input (default: a 3x224x224 float32 image)",
        default=float(IMAGE_BYTES), minimum=0, maximum=MAX_BYTES),
    Key("input_bytes_per_token", "number", "more bytes per token of the query's length", default=0.0, minimum=0,
        maximum=MAX_BYTES),
    Key("bandwidth_gbps", "number", "effective host-to-device bandwidth, GB/s (12: PCIe 3.0 x16, pinned)",
        default=12.0, minimum=0, strict=True),
))


@dataclass(frozen=True)
class Transfer:
    mode: str = "none"
    input_bytes: float = float(IMAGE_BYTES)
    input_bytes_per_token: float = 0.0
    bandwidth_gbps: float = 12.0

    def query_ms(self, seq_len: int = 1) -> float:
        """The copy time of one query's input (ms)."""
        return (self.input_bytes + self.input_bytes_per_token * seq_len) / (self.bandwidth_gbps * 1e6)

    def batch_ms(self, rows: int, seq_len: int = 1) -> float:
        """The copy time of a batch of ``rows`` inputs padded to ``seq_len`` (ms)."""
        return rows * self.query_ms(seq_len)

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode, "input_bytes": self.input_bytes,
                "input_bytes_per_token": self.input_bytes_per_token, "bandwidth_gbps": self.bandwidth_gbps}


def transfer_from_config(section: Any) -> Transfer | None:
    """The :class:`Transfer` of an ``[engine.transfer]`` table, or None when absent or ``mode = "none"``."""
    if section is None:
        return None
    vals = TRANSFER.check(section)
    mode = vals.pop("mode", "none")
    if mode == "none":
        return None
    return Transfer(mode=mode, **vals)


class PoolLink:
    """The memory pool's one copy at a time: ``visible(door, x)`` -> when the copy of an input that reached the
    front door at ``door`` and takes ``x`` ms is done (inputs given in arrival order)."""

    def __init__(self) -> None:
        self.free_at = -math.inf

    def visible(self, door: float, x: float) -> float:
        t = (door if door > self.free_at else self.free_at) + x
        self.free_at = t
        return t
