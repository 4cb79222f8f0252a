"""Per-batch host costs of a serving stack, and the bytes a model's queries carry.

A batch pays, on the way in (at every first-stage launch: a new batch, or the rows a *stretch* adds, which are
fresh inputs too):

    entry_host = request_ms + (request_per_row_ms + gather_per_row_ms) * rows + in_bytes / gather_gbps
    entry_copy = in_bytes / h2d_gbps          (on the one host-to-device link, shared by all instances)

(E2bird's memory pool, ``[engine.transfer] mode = "pool"``, has every input on the GPU, gathered, before the
batch forms: then neither the gathering nor the copy is paid here; ``mode = "on_launch"`` replaces the copy only)
and on the way out (at every last-stage completion: each sub-batch of a split answers on its own):

    exit = sync_ms + out_bytes / d2h_gbps

with ``in_bytes = rows * input_bytes(padded length)`` and ``out_bytes = rows * output_bytes``; bandwidths in GB/s
(1 GB = 1e9 bytes, so ``bytes / (gbps * 1e6)`` is in ms). Where the stack's batch thread leaves the GPU idle
between its batches (``idle_between_batches``: it prepares a batch, runs it, synchronises and answers before it
takes the next) the entry comes before the first stage's GPU work and the exit holds the last stage's executor.
Otherwise (asynchronous copies, a completion thread: Triton's TensorRT backend) the entry runs on the host beside
the first stage's GPU work and the exit delays only the batch's answers (:func:`dvasim.engines.sim.engine.simulate`).

The input and output sizes of the zoo's models (:data:`MODEL_IO`) are the shapes of
:mod:`dvasim.model.zoo` (written out here so that the simulator needs no torch): float32 images, BERT's
token ids, attention mask and segment ids as int64 (the Hugging Face convention), a classifier's float32 scores,
a segmentation net's float32 per-pixel class maps.
"""

from __future__ import annotations

from dataclasses import dataclass

# model -> (input bytes per query, more input bytes per token, output bytes per query); full variants
MODEL_IO: dict[str, tuple[float, float, float]] = {
    "resnet152": (3 * 224 * 224 * 4, 0.0, 1000 * 4),      # 224x224 RGB float32 in, 1000 class scores out
    "vgg19": (3 * 224 * 224 * 4, 0.0, 1000 * 4),
    "vgg16": (3 * 224 * 224 * 4, 0.0, 1000 * 4),
    "unet": (3 * 256 * 256 * 4, 0.0, 2 * 256 * 256 * 4),  # 256x256 RGB in, 2 class maps at full size out
    "linknet": (3 * 256 * 256 * 4, 0.0, 2 * 256 * 256 * 4),
    "bert_base": (0.0, 3 * 8, 2 * 4),                     # ids, mask, segment ids (int64) per token; 2 logits
    "bert_large": (0.0, 3 * 8, 2 * 4),
}
DEFAULT_IO = MODEL_IO["resnet152"]  # a table of an unknown model: one 224x224 image in, 1000 scores out


def model_io(name: str | None) -> tuple[tuple[float, float, float], str]:
    """The bytes of one query of model ``name`` and where they come from."""
    for key, io in MODEL_IO.items():
        if name and key in name.lower():
            return io, f"{key}: the zoo's input and output shapes"
    return DEFAULT_IO, "unknown model: one 224x224 float32 image in, 1000 float32 scores out (assumed)"


def _ms(n_bytes: float, gbps: float) -> float:
    return 0.0 if gbps == float("inf") or n_bytes <= 0 else n_bytes / (gbps * 1e6)


@dataclass(frozen=True)
class BatchCosts:
    """A stack's per-batch host costs for one model (see the module docstring)."""

    request_ms: float = 0.0
    request_per_row_ms: float = 0.0
    gather_per_row_ms: float = 0.0
    gather_gbps: float = float("inf")
    h2d_gbps: float = float("inf")
    d2h_gbps: float = float("inf")
    sync_ms: float = 0.0
    idle_between_batches: bool = False
    input_bytes: float = 0.0
    input_bytes_per_token: float = 0.0
    output_bytes: float = 0.0
    copy_inputs: bool = True  # False: another model ([engine.transfer]) moves the inputs to the GPU
    python_level: bool = False  # the entry's host work holds the interpreter lock (a Python serving loop)
    gather_inputs: bool = True  # False: the inputs are already gathered on the GPU (E2bird's memory pool)

    def in_bytes(self, rows: int, seq_len: int | None) -> float:
        return rows * (self.input_bytes + self.input_bytes_per_token * (seq_len or 0))

    def entry_host_ms(self, rows: int, seq_len: int | None) -> float:
        """Request handling and the inputs' gathering on the host, before the first stage launches."""
        if not self.gather_inputs:
            return self.request_ms + self.request_per_row_ms * rows
        return (self.request_ms + (self.request_per_row_ms + self.gather_per_row_ms) * rows
                + _ms(self.in_bytes(rows, seq_len), self.gather_gbps))

    def h2d_ms(self, rows: int, seq_len: int | None) -> float:
        """The inputs' host-to-device copy (0 where [engine.transfer] moves them)."""
        return _ms(self.in_bytes(rows, seq_len), self.h2d_gbps) if self.copy_inputs else 0.0

    def exit_ms(self, rows: int) -> float:
        """Synchronisation and the outputs' device-to-host copy after the last stage."""
        return self.sync_ms + _ms(rows * self.output_bytes, self.d2h_gbps)
