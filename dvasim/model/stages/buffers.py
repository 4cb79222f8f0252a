"""Real tensor buffers between the stage executors: one per (lane, boundary, slot), as in the paper's §6.1.

Stage ``s`` of lane (model instance) ``l`` reads buffer ``(l, s, j)`` and writes buffer ``(l, s+1, j)`` when it
runs a batch in buffer pair ``j``; boundary 0 holds the model's input, boundary ``N`` its output. Each buffer is
allocated once, up front, for ``max_rows`` batch rows (the table's largest batch size) and the longest input, and
holds the *carry* at that boundary: a tensor or a (nested) tuple of tensors (residuals, skip connections, BERT's
attention mask). An execution reads and writes exactly the rows the mechanism gives it (``Execution.rows``), so a
mechanism bug (two batches in one pair at once, a pair handed back too early) would corrupt real data, and a
test can compare every query's output with the unbatched model's.

Sequence models: a carry tensor may have *sequence dimensions* (their size is the batch's padded length ``L``).
They are found by probing the model at two lengths. An execution of length ``L`` reads and writes the first
``L`` positions of its rows. Rows written at a shorter length and later read at a longer one (a *stretched*
batch whose newcomers are longer than its first queries) are padded, at read time, with the carry of an
all-padding input (token id 0), so the padded positions are exactly what padding the input would give: masked
keys for attention (BERT's additive mask is -10000 there) and finite values elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["BufferSet", "InputStore", "flatten", "unflatten"]


# ----------------------------------------------------------------------------- carries as flat leaves
def flatten(carry: Any) -> tuple[list, Any]:
    """``carry`` -> (list of leaves (tensors or None), structure) so that ``unflatten`` rebuilds it."""
    if carry is None or isinstance(carry, torch.Tensor):
        return [carry], "leaf"
    if isinstance(carry, (tuple, list)):
        leaves, defs = [], []
        for c in carry:
            lv, d = flatten(c)
            leaves.extend(lv)
            defs.append((len(lv), d))
        return leaves, (type(carry), defs)
    raise TypeError(f"unsupported carry element {type(carry).__name__}")


def unflatten(structure: Any, leaves: list) -> Any:
    if structure == "leaf":
        return leaves[0]
    kind, defs = structure
    out, k = [], 0
    for n, d in defs:
        out.append(unflatten(d, leaves[k : k + n]))
        k += n
    return kind(out)


@dataclass
class _Leaf:
    tail: tuple[int, ...]  # per-row shape at the longest length
    dtype: torch.dtype
    seq_dims: tuple[int, ...]  # dims of the per-row shape that follow the sequence length
    template: torch.Tensor | None  # per-row carry of an all-padding input (only for leaves with seq dims)


@dataclass
class _Spec:
    structure: Any
    leaves: list[_Leaf | None]  # None for a None leaf

    @property
    def has_seq(self) -> bool:
        return any(lf is not None and lf.seq_dims for lf in self.leaves)


class InputStore:
    """The real inputs of every sample, allocated up front: token ids (zero-padded to the longest length) for
    BERT, images for the CNNs (a pool of ``image_pool`` distinct images; sample ``k`` uses image ``k % pool``).

    Deterministic given ``seed``: sample ``k`` gets the same ids / image in every run.
    """

    def __init__(self, model, seq_lens, seed: int = 0, image_pool: int = 64, device: str | torch.device = "cpu",
                 pin: bool = False):
        self.kind = model.input_kind
        lens = [int(x) for x in seq_lens]
        self.n = len(lens)
        self.seq_lens = lens
        g = torch.Generator().manual_seed(int(seed))
        if self.kind == "tokens":
            self.max_len = max(lens)
            ids = torch.zeros(self.n, self.max_len, dtype=torch.int64)
            vocab = int(model.config["vocab_size"])
            for k, L in enumerate(lens):
                ids[k, :L] = torch.randint(1, vocab, (L,), generator=g)
            self.data = ids
        else:
            self.max_len = 1
            pool = max(1, min(image_pool, self.n))
            self.data = model.example_input(pool, generator=g)
        if pin:
            self.data = self.data.pin_memory()
        self.device = torch.device(device)

    def sample(self, k: int) -> torch.Tensor:
        """Sample ``k`` alone, unpadded: ids ``[1, L]`` or an image ``[1, 3, H, W]``."""
        if self.kind == "tokens":
            return self.data[k : k + 1, : self.seq_lens[k]]
        return self.data[k % self.data.shape[0]].unsqueeze(0)

    def gather(self, samples: list[int], length: int) -> torch.Tensor:
        """Rows of ``samples`` (ids cut or zero-padded to ``length``), on the store's device."""
        if self.kind == "tokens":
            idx = torch.as_tensor(samples, dtype=torch.int64)
            x = self.data.index_select(0, idx)[:, :length]
            if x.shape[1] < length:  # a length bucket above the longest input: padding tokens (id 0)
                x = torch.nn.functional.pad(x, (0, length - x.shape[1]))
        else:
            idx = torch.as_tensor([s % self.data.shape[0] for s in samples], dtype=torch.int64)
            x = self.data.index_select(0, idx)
        return x.to(self.device, non_blocking=True)


class BufferSet:
    """Every buffer of every lane, boundary and slot (see the module docstring).

    ``model`` is a :class:`dvasim.model.zoo.ZooModel`; ``bounds`` the first operator of each stage.
    ``max_len`` is the longest input length any query will have (1 for images).
    """

    def __init__(self, model, bounds: list[int], n_lanes: int, n_pairs: int, max_rows: int, max_len: int = 1,
                 device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.n_stages = len(bounds)
        self.n_lanes, self.n_pairs, self.max_rows = n_lanes, n_pairs, int(max_rows)
        self.kind = model.input_kind
        self.max_len = int(max_len) if self.kind == "tokens" else 1
        ends = [*bounds[1:], model.n_ops()]
        self.specs = self._probe(model, bounds, ends)
        self.padded_rows = 0  # rows padded at read time (stretched batches with longer newcomers)
        # buffers[lane][boundary][slot] = list of leaf tensors (None for None leaves)
        self.buffers: list[list[list[list[torch.Tensor | None]]]] = []
        self.valid: list[list[list[list[int]]]] = []  # written length of each row (sequence models)
        for _ in range(n_lanes):
            lane_bufs, lane_valid = [], []
            for spec in self.specs:
                lane_bufs.append([
                    [None if lf is None else torch.zeros((self.max_rows, *lf.tail), dtype=lf.dtype, device=self.device)
                     for lf in spec.leaves]
                    for _ in range(n_pairs)
                ])
                lane_valid.append([[self.max_len] * self.max_rows for _ in range(n_pairs)])
            self.buffers.append(lane_bufs)
            self.valid.append(lane_valid)

    # ------------------------------------------------------------------ probing the carries
    def _probe(self, model, bounds, ends) -> list[_Spec]:
        boundaries = [*bounds, ends[-1]]  # first op of each stage, then the end of the model

        dev = next(iter(model.module().parameters())).device

        def carries(x):
            out, c = [], x.to(dev)
            with torch.inference_mode():
                for b in range(len(boundaries)):
                    if b > 0:
                        c = model.run_ops(c, boundaries[b - 1], boundaries[b])
                    out.append(flatten(carry_clone(c)))
            return out

        g = torch.Generator().manual_seed(0)
        if self.kind == "tokens":
            La = self.max_len
            top = int(model.max_seq_len or La + 1)
            Lb = La + 1 if La + 1 <= top else La - 1
            at_a = carries(model.example_input(1, La, generator=g))
            at_b = carries(model.example_input(1, Lb, generator=g)) if Lb >= 1 else at_a
            pad = carries(torch.zeros(1, La, dtype=torch.int64))
        else:
            La = Lb = 1
            at_a = at_b = carries(model.example_input(1, generator=g))
            pad = None
        specs = []
        for b, (leaves_a, struct) in enumerate(at_a):
            leaves_b, struct_b = at_b[b]
            if struct_b != struct:
                raise ValueError(f"{model.name}: the carry at boundary {b} changes structure with the input length")
            out = []
            for i, (ta, tb) in enumerate(zip(leaves_a, leaves_b)):
                if ta is None:
                    out.append(None)
                    continue
                seq_dims = tuple(d - 1 for d in range(1, ta.dim()) if ta.shape[d] != tb.shape[d])
                for d in seq_dims:
                    if ta.shape[d + 1] != La:
                        raise ValueError(f"{model.name}: carry leaf {i} at boundary {b} has a length-dependent "
                                         f"dimension of size {ta.shape[d + 1]} != the input length {La}")
                template = pad[b][0][i][0].to(self.device) if seq_dims else None
                out.append(_Leaf(tuple(ta.shape[1:]), ta.dtype, seq_dims, template))
            specs.append(_Spec(struct, out))
        return specs

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for lane in self.buffers for bnd in lane for slot in bnd
                   for t in slot if t is not None)

    # ------------------------------------------------------------------ access
    def _check(self, rows: range) -> None:
        if rows.start < 0 or rows.stop > self.max_rows or rows.step != 1:
            raise IndexError(f"rows {rows.start}..{rows.stop - 1} outside the buffer's {self.max_rows} rows")

    @staticmethod
    def _narrow(t: torch.Tensor, seq_dims, length: int) -> torch.Tensor:
        for d in seq_dims:
            t = t.narrow(d + 1, 0, length)
        return t

    @staticmethod
    def _cut(row: torch.Tensor, seq_dims, length: int) -> torch.Tensor:
        """A single row (no batch dim) cut to ``length`` positions."""
        for d in seq_dims:
            row = row.narrow(d, 0, length)
        return row

    def read(self, lane: int, boundary: int, slot: int, rows: range, length: int = 1) -> Any:
        """The carry of ``rows`` at ``boundary`` (views into the buffer), cut to ``length`` positions."""
        self._check(rows)
        spec = self.specs[boundary]
        bufs = self.buffers[lane][boundary][slot]
        if spec.has_seq:
            self._pad_short_rows(lane, boundary, slot, rows, length)
        leaves = []
        for lf, buf in zip(spec.leaves, bufs):
            if lf is None:
                leaves.append(None)
                continue
            leaves.append(self._narrow(buf[rows.start : rows.stop], lf.seq_dims, length))
        return unflatten(spec.structure, leaves)

    def write(self, lane: int, boundary: int, slot: int, rows: range, carry: Any, length: int = 1) -> None:
        """Copy ``carry`` (the output of a stage for ``rows``, at ``length`` positions) into the buffer."""
        self._check(rows)
        spec = self.specs[boundary]
        leaves, struct = flatten(carry)
        if struct != spec.structure or len(leaves) != len(spec.leaves):
            raise ValueError(f"boundary {boundary}: the carry's structure differs from the probed one")
        bufs = self.buffers[lane][boundary][slot]
        for lf, buf, t in zip(spec.leaves, bufs, leaves):
            if lf is None:
                continue
            self._narrow(buf[rows.start : rows.stop], lf.seq_dims, length).copy_(t, non_blocking=True)
        if spec.has_seq:
            valid = self.valid[lane][boundary][slot]
            for r in rows:
                valid[r] = length

    def _pad_short_rows(self, lane, boundary, slot, rows, length) -> None:
        valid = self.valid[lane][boundary][slot]
        short = [r for r in rows if valid[r] < length]
        if not short:
            return
        spec = self.specs[boundary]
        for lf, buf in zip(spec.leaves, self.buffers[lane][boundary][slot]):
            if lf is None or not lf.seq_dims:
                continue
            for r in short:
                v = valid[r]
                row = self._cut(buf[r], lf.seq_dims, length)
                kept = self._cut(row, lf.seq_dims, v).clone()
                row.copy_(self._cut(lf.template, lf.seq_dims, length))
                self._cut(row, lf.seq_dims, v).copy_(kept)
        for r in short:
            valid[r] = length
        self.padded_rows += len(short)


def carry_clone(c: Any) -> Any:
    if c is None:
        return None
    if isinstance(c, torch.Tensor):
        return c.clone()
    return type(c)(carry_clone(x) for x in c)
