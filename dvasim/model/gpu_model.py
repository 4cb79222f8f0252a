"""Analytic GPU latency model: per-operator time from the FLOPs and bytes of the actual torch graphs.

Nothing here runs on a GPU. For every operator of a :mod:`dvasim.model.zoo` model we propagate shapes
on the ``meta`` device, record the ATen calls it makes, group them into GPU *kernels* the way an inference
engine would run them, and time each kernel with a roofline that has wave quantisation over the SMs.

Kernels (``fusion="tensorrt"``, used for the Titan RTX and A100 tables)
    * GEMM kernels: ``mm``/``addmm``/``bmm`` and ``convolution`` (implicit GEMM; transposed convolutions as
      the equivalent GEMM with ``K = flops / (2 M N)``). ``M`` = output rows (batch x output pixels or
      tokens), ``N`` = output channels/features, ``K`` = reduction length, ``B`` = independent GEMMs (heads).
    * memory kernels: softmax, layer norm, pooling, embedding gathers, global mean.
    * element-wise ops (ReLU, GELU, tanh, bias/BN scale-shift, residual add, mask add, scaling) are fused
      into the kernel that produced their input (TensorRT epilogue fusion); tensors they read from outside
      the operator (a residual, the mask) add to that kernel's bytes. ``cat`` is free (TensorRT concat
      elimination), as are views, transposes and copies for layout (``clone``).
    ``fusion="none"`` makes every element-wise op its own memory kernel (TensorFlow 1.x / Caffe without graph
    fusion; used only to validate against the E2bird and Nexus measurements, which were taken that way).
    ``fusion="torch"`` (the H100 tables: torch's eager kernels, captured as CUDA graphs) also has every
    element-wise op its own kernel, plus the kernels torch launches where TensorRT would not: a convolution's
    bias added after cuDNN's kernel, copies (``clone`` where a reshape of a strided view is not a view, ``cat``,
    dtype casts; traced at batch 2-4 and at batch 1, where some reshapes are views), fills (``arange``) and the
    int64 indices max pooling writes. 1x1 convolutions with a stride are marked ``strided`` (their own class).

Time of one kernel (microseconds)::

    t = max(t0, t_compute, t_memory)          (additive_t0: t = t0 + max(t_compute, t_memory))
    t_memory  = bytes / (BW * e_mem)
    t_compute = waves * (2 * b * b * K) / (P * e_c / slots)            (GEMM kernels; 0 for memory kernels)
              [+ gemm_latency + K * k_latency]                          (model v1.2 terms, zero by default)
    blocks = B * ceil(M / b) * ceil(N / b),  slots = SMs * s,  waves = ceil(blocks / slots)

``P`` is the device's peak FLOP/s for the precision, ``BW`` its DRAM bandwidth, ``b = 32`` the output block
edge and ``s`` the number of output blocks an SM needs in flight to be saturated. While ``blocks <= slots``
the GEMM's time does not grow with the batch (the GPU is not full); past that it grows in steps of one
wave. This produces the *preferred batch sizes* of DVABatch's Figure 5. An operator's time is the sum of its
kernels' times (kernels of one operator run back to back on one stream).

Free parameters (:class:`ModelParams`): ``e_c`` (achieved fraction of peak in a full wave), ``e_mem``
(achieved fraction of DRAM bandwidth), ``t0`` (per-kernel launch/ramp/drain time) and ``s``; the H100 fit adds
per-class efficiencies (convolutions with a ramp in the output channels, transposed and strided convolutions),
GEMM latencies and kernel-selection switches (no split-K, narrow blocks, matrix-vector products for one row).
How they were set, and the errors against published and measured times, are in ``traces/gpu/README.md``.

Activations are assumed to go to DRAM (no L2 reuse across kernels). GEMMs may split long, thin reductions
(split-K) unless ``split_k`` is off.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

MODEL_VERSION = "1.2"  # 1.2: torch kernels (fusion="torch"), per-class efficiencies and latencies (H100 fit)

__all__ = [
    "MODEL_VERSION",
    "GPUSpec",
    "GPUS",
    "ModelParams",
    "PARAMS",
    "DEFAULT_PRECISION",
    "Kernel",
    "KernelTemplate",
    "trace_kernels",
    "op_templates",
    "kernel_time_us",
    "op_latencies_ms",
    "model_latency_ms",
    "gemm_latency_ms",
    "preferred_batch_size",
]


# --------------------------------------------------------------------------------------------- devices
@dataclass(frozen=True)
class GPUSpec:
    """Peak numbers of one GPU. ``peak_tflops`` maps precision -> dense peak TFLOP/s."""

    key: str
    name: str
    sms: int
    boost_clock_mhz: int
    peak_tflops: dict[str, float]
    dram_gbs: float
    l2_mb: float
    source: str

    def peak_flops(self, precision: str) -> float:
        if precision not in self.peak_tflops:
            raise ValueError(
                f"{self.key}: no peak for precision {precision!r}; have {sorted(self.peak_tflops)}"
            )
        return self.peak_tflops[precision] * 1e12


GPUS: dict[str, GPUSpec] = {
    # NVIDIA TITAN RTX (TU102): 72 SMs x 64 FP32 lanes = 4608 CUDA cores, boost 1770 MHz
    #   -> FP32 4608 * 2 * 1.770 GHz = 16.3 TFLOPS; 576 tensor cores, FP16 (FP32 accumulate) 130.5 TFLOPS;
    #   24 GB GDDR6, 384-bit at 14 Gbps = 672 GB/s; 6 MB L2.
    #   Sources: NVIDIA Turing GPU Architecture whitepaper (2018), Appendix A "TITAN RTX" column;
    #   72 SMs also in DVABatch Sec. 1 and E2bird Table 5 ("72 SMs, 576 Tensor Cores").
    "titanrtx": GPUSpec(
        key="titanrtx",
        name="NVIDIA Titan RTX",
        sms=72,
        boost_clock_mhz=1770,
        peak_tflops={"fp32": 16.3, "fp16": 130.5},
        dram_gbs=672.0,
        l2_mb=6.0,
        source="NVIDIA Turing architecture whitepaper (Appendix A, TITAN RTX)",
    ),
    # NVIDIA TITAN X (Pascal) (GP102): 28 SMs x 128 = 3584 CUDA cores, boost 1531 MHz
    #   -> FP32 3584 * 2 * 1.531 GHz = 10.97 TFLOPS; no fast FP16 (1/64 rate); 12 GB GDDR5X, 384-bit at
    #   10 Gbps = 480 GB/s; 3 MB L2. Source: NVIDIA TITAN X (Pascal) product page / GP102 specifications.
    "titanx_pascal": GPUSpec(
        key="titanx_pascal",
        name="NVIDIA TITAN X (Pascal)",
        sms=28,
        boost_clock_mhz=1531,
        peak_tflops={"fp32": 10.97},
        dram_gbs=480.0,
        l2_mb=3.0,
        source="NVIDIA TITAN X (Pascal) specifications (3584 cores, 1531 MHz boost, 480 GB/s)",
    ),
    # NVIDIA A100 (SXM4 40 GB): 108 SMs, boost 1410 MHz; FP32 19.5, TF32 tensor 156, FP16 tensor 312 TFLOPS
    #   (dense); HBM2 1555 GB/s; 40 MB L2. Source: NVIDIA A100 Tensor Core GPU Architecture whitepaper
    #   (2020), Table 1 / A100 datasheet. The characterization study only says "NVIDIA A100".
    "a100": GPUSpec(
        key="a100",
        name="NVIDIA A100 (SXM4 40GB)",
        sms=108,
        boost_clock_mhz=1410,
        peak_tflops={"fp32": 19.5, "tf32": 156.0, "fp16": 312.0},
        dram_gbs=1555.0,
        l2_mb=40.0,
        source="NVIDIA A100 whitepaper Table 1 / A100 datasheet (40GB SXM4)",
    ),
    # NVIDIA H100 (SXM5 80 GB): 132 SMs, boost 1980 MHz; FP32 67, TF32 tensor 494.7, FP16 tensor 989.4
    #   TFLOPS (dense, i.e. half the datasheet's with-sparsity figures); HBM3 3350 GB/s; 50 MB L2.
    #   Source: NVIDIA H100 Tensor Core GPU datasheet / Hopper architecture whitepaper (2022), Table 3.
    "h100": GPUSpec(
        key="h100",
        name="NVIDIA H100 (SXM5 80GB)",
        sms=132,
        boost_clock_mhz=1980,
        peak_tflops={"fp32": 67.0, "tf32": 494.7, "fp16": 989.4},
        dram_gbs=3350.0,
        l2_mb=50.0,
        source="NVIDIA H100 datasheet / Hopper whitepaper Table 3 (SXM5, dense)",
    ),
}

# Precision of the shipped tables. Titan RTX: TensorRT builds FP32 engines unless FP16 is requested, and
# Turing has no TF32 (the DVABatch paper does not state a precision). A100/H100: TensorRT >= 7.1 enables TF32
# tensor cores by default for FP32 networks.
DEFAULT_PRECISION = {"titanrtx": "fp32", "titanx_pascal": "fp32", "a100": "tf32", "h100": "tf32"}

BYTES_PER_ELEMENT = {"fp32": 4, "tf32": 4, "fp16": 2}


# --------------------------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class ModelParams:
    """The model's free parameters (see module docstring)."""

    compute_eff: float  # e_c: fraction of peak FLOP/s reached by a full wave of GEMM blocks
    mem_eff: float = 0.8  # e_mem: fraction of DRAM bandwidth reached by streaming kernels (STREAM-like)
    kernel_overhead_us: float = 4.0  # t0: per-kernel launch + ramp + drain
    blocks_per_sm: int = 3  # s: 32x32 output blocks an SM needs in flight to be saturated
    block: int = 32  # b: output block edge
    fusion: str = "tensorrt"  # "tensorrt" (epilogue fusion), "none" (one kernel per ATen op) or "torch" (module doc)
    note: str = ""
    # Model v1.1/v1.2 terms, all inert at their defaults (the Titan RTX and A100 sets do not use them); fitted on
    # the H100 measurements of torch's kernels (traces/gpu/README.md, "H100"):
    # per-class compute efficiency (None: compute_eff, which is then cuBLAS's GEMMs): cuDNN convolutions,
    # transposed convolutions, and 1x1 convolutions with a stride (ResNet's downsampling shortcuts)
    conv_eff: float | None = None
    tconv_eff: float | None = None
    strided_eff: float | None = None
    # convolution efficiency ramps with the output channels N: e * N / (N + conv_n_half) (a narrow output fills
    # only part of cuDNN's wide tiles); 0 keeps e constant
    conv_n_half: float = 0.0
    # latencies of a GEMM kernel on top of its waves (latency + work): a fixed one (filling the tile pipeline,
    # the epilogue) and one per element of the reduction one block runs (its K loop: load, wait, multiply)
    gemm_latency_us: float = 0.0
    gemm_k_latency_ns: float = 0.0  # cuBLAS GEMMs (mm, addmm, bmm)
    conv_k_latency_ns: float = 0.0  # cuDNN convolutions (implicit GEMM: the im2col addressing of every step)
    # t0 added to every kernel (back-to-back kernels of a CUDA graph each pay launch, ramp and drain) instead of
    # being a floor: t = t0 + max(t_compute, t_memory) rather than max(t0, t_compute, t_memory)
    additive_t0: bool = False
    split_k: bool = True  # GEMMs may split long, thin reductions (see _gemm_compute_us)
    narrow_tiles: bool = False  # a GEMM narrower than a block (N < b) runs blocks only N wide
    gemv: bool = False  # a GEMM with one row (mm/addmm with M = 1) is a matrix-vector product: memory-bound

    def eff_for(self, names: tuple[str, ...]) -> float:
        if "strided" in names and self.strided_eff:
            return self.strided_eff
        if "conv_transpose" in names:
            return self.tconv_eff or self.conv_eff or self.compute_eff
        if "convolution" in names:
            return self.conv_eff or self.compute_eff
        return self.compute_eff


# The calibrated sets. How each number was obtained is documented in traces/gpu/README.md ("Calibration").
#  * blocks_per_sm = 3: the smallest integer for which the two GEMMs of DVABatch Figure 5 (Titan RTX) have
#    their published preferred batch sizes (1 and 8); kept for all devices.
#  * mem_eff = 0.8: typical achieved fraction of DRAM bandwidth (not fitted).
#  * compute_eff, kernel_overhead_us: least-squares fits (relative error) to the FIT points named below;
#    every other published point is a hold-out.
PARAMS: dict[str, ModelParams] = {
    # Shipped Titan RTX tables (TensorRT-style fusion): e_c from the E2bird fit below; t0 = 5 us is an
    # assumption (minimum duration of a back-to-back kernel on one stream; TensorRT has no per-op framework
    # overhead), not fitted.
    "titanrtx": ModelParams(
        compute_eff=0.62, kernel_overhead_us=5.0, note="e_c fit: E2bird Table 1 Res50; t0 assumed"
    ),
    # TF-Serving on Titan RTX (unfused kernels): e_c and t0 fitted on E2bird Table 1 ResNet-50 (batch 4-32).
    "titanrtx_tf": ModelParams(
        compute_eff=0.62, kernel_overhead_us=22.0, fusion="none", note="fit: E2bird Table 1 Res50"
    ),
    # Caffe on TITAN X (Pascal) (unfused kernels): fitted on the Nexus VGG-16 profile at batch 1, 8 and 32.
    "titanx_pascal": ModelParams(
        compute_eff=0.96, kernel_overhead_us=88.0, fusion="none", note="fit: Nexus VGG16 bs 1, 8, 32"
    ),
    # A100 (what-if): the shipped Titan RTX parameters, unchanged (nothing fitted to A100 data).
    "a100": ModelParams(compute_eff=0.62, kernel_overhead_us=5.0, note="Titan RTX parameters, not fitted"),
    # H100: fitted to GPU time measured on an NVIDIA H100 80GB HBM3 (torch 2.11 kernels captured as CUDA graphs,
    # TF32; traces/gpu/h100/measured/) by build_gpu_tables.fit_h100 on the operators at batch 1, 8 and 32 (their
    # sums over the four measured stages, plus the operators themselves). Torch's kernels (fusion="torch"), so
    # these are the tables of a torch serving stack, not of TensorRT. blocks_per_sm and block as everywhere.
    "h100": ModelParams(
        compute_eff=0.7455, conv_eff=0.8957, tconv_eff=0.322, strided_eff=0.1689, conv_n_half=183.1,
        mem_eff=0.7809, kernel_overhead_us=1.632, gemm_latency_us=2.699, gemm_k_latency_ns=1.562,
        conv_k_latency_ns=4.48, additive_t0=True, split_k=False, narrow_tiles=True, gemv=True, fusion="torch",
        note="fit: measured H100 torch GPU times (traces/gpu/h100/measured), operators at batch 1, 8, 32",
    ),
}


# --------------------------------------------------------------------------------------------- kernels
@dataclass
class Kernel:
    """One GPU kernel of one operator at one batch size: GEMM dims (``B, M, N, K``; zero for memory kernels),
    FLOPs, DRAM bytes at FP32 (``bytes_fp32``; index tensors counted at their own size in ``bytes_int``)."""

    kind: str  # "gemm" | "mem"
    names: list[str]
    B: int = 0
    M: int = 0
    N: int = 0
    K: float = 0.0
    flops: float = 0.0
    bytes_fp32: float = 0.0
    bytes_int: float = 0.0


_VIEW_OPS = {
    "view",
    "_unsafe_view",
    "reshape",
    "t",
    "transpose",
    "permute",
    "expand",
    "unsqueeze",
    "squeeze",
    "select",
    "slice",
    "unbind",
    "split",
    "alias",
    "detach",
    "clone",
    "contiguous",
    "cat",
    "_to_copy",
    "flatten",
    "as_strided",
    "expand_as",
    "lift_fresh",
}
_CREATE_OPS = {
    "empty",
    "arange",
    "zeros",
    "ones",
    "full",
    "scalar_tensor",
    "empty_like",
    "zeros_like",
    "new_empty",
}
# fusion="torch": ops that launch a copy or fill kernel in torch eager (free under TensorRT-style fusion)
_COPY_OPS = {"clone", "contiguous", "cat", "_to_copy", "copy_", "copy"}
_FILL_OPS = {"arange", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "fill_"}
_BN_OPS = {"native_batch_norm", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit"}
_GEMM_OPS = {"mm", "addmm", "bmm", "convolution"}
_MEM_OPS = {
    "_softmax",
    "softmax",
    "native_layer_norm",
    "layer_norm",
    "max_pool2d_with_indices",
    "max_pool2d",
    "avg_pool2d",
    "mean",
    "_adaptive_avg_pool2d",
    "adaptive_avg_pool2d",
    "embedding",
    "sum",
    "amax",
}


def _tensors(obj) -> list:
    import torch

    out = []
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            out.extend(_tensors(o))
    return out


def _nbytes(t) -> tuple[float, float]:
    """(float bytes at fp32, integer bytes) of a tensor."""
    n = t.numel()
    if t.dtype.is_floating_point:
        return 4.0 * n, 0.0
    return 0.0, float(n * t.element_size())


class _OpRecorder:
    """Groups the ATen calls of one zoo operator into kernels (see module docstring)."""

    def __init__(self, fusion: str):
        self.fusion = fusion
        self.kernels: list[Kernel] = []
        self.producer: dict[int, int] = {}  # id(tensor) -> kernel index (or -1: pending, no kernel yet)
        self.keep: list = []  # keep produced tensors alive so their ids are not reused
        self.pending_fp = 0.0
        self.pending_int = 0.0
        self.pending_names: list[str] = []

    def _mark(self, outs, idx: int) -> None:
        for t in outs:
            self.producer[id(t)] = idx
            self.keep.append(t)

    def _src(self, ins) -> int | None:
        """Kernel producing one of the inputs (the latest), or None if all come from outside the op."""
        idx = [self.producer[id(t)] for t in ins if id(t) in self.producer]
        return max(idx) if idx else None

    def _outside_bytes(self, ins) -> tuple[float, float]:
        fp = it = 0.0
        for t in ins:
            if id(t) not in self.producer:
                a, b = _nbytes(t)
                fp, it = fp + a, it + b
        return fp, it

    def _new_kernel(self, k: Kernel, outs) -> None:
        if self.pending_names:  # prologue fusion of element-wise ops on the op's inputs
            k.names = self.pending_names + k.names
            self.pending_names = []
        self.kernels.append(k)
        idx = len(self.kernels) - 1
        for key, v in list(self.producer.items()):
            if v == -1:
                self.producer[key] = idx
        self._mark(outs, idx)

    def record(self, name: str, func, args, kwargs, out) -> None:
        ins = _tensors(args) + _tensors(list(kwargs.values()))
        outs = _tensors(out)
        if self.fusion == "torch" and (name in _COPY_OPS or name in _FILL_OPS):
            # torch eager: a copy (contiguous/reshape of a strided view, cat, dtype cast) or a fill is a kernel
            fp = sum(_nbytes(t)[0] for t in ins)
            it = sum(_nbytes(t)[1] for t in ins)
            if name in _FILL_OPS:  # its output, whatever the dtype (arange: a batch-independent index vector)
                fp += sum(t.numel() * t.element_size() for t in outs[:1])
            else:
                fp, it = fp + sum(_nbytes(t)[0] for t in outs[:1]), it + sum(_nbytes(t)[1] for t in outs[:1])
            k = Kernel("mem", [name], bytes_fp32=fp, bytes_int=it)
            self.kernels.append(k)
            self._mark(outs, len(self.kernels) - 1)
            return
        if name in _CREATE_OPS:
            self._mark(outs, -1 if not self.kernels else len(self.kernels) - 1)
            return
        if name in _VIEW_OPS:
            src = self._src(ins)
            if src is not None:
                self._mark(outs, src)
            return
        if name in _GEMM_OPS:
            self._new_kernel(self._gemm(name, args, ins, outs), outs)
            if self.fusion == "torch" and name == "convolution" and args[2] is not None:
                # torch adds a convolution's bias in a kernel of its own after cuDNN's (output.add_(bias))
                o = _nbytes(outs[0])[0]
                self.kernels.append(Kernel("mem", ["conv_bias"], bytes_fp32=2 * o + _nbytes(args[2])[0]))
                self._mark(outs, len(self.kernels) - 1)
            return
        if name in _MEM_OPS:
            fp, it = self._outside_bytes(ins)
            if name == "embedding":  # reads only the gathered rows, not the whole table
                fp = _nbytes(outs[0])[0]
            ofp = sum(_nbytes(t)[0] for t in outs[:1])
            src_bytes = sum(_nbytes(t)[0] for t in ins if id(t) in self.producer)
            if self.fusion == "torch":  # max pooling writes its argmax indices (int64) as well
                it += sum(_nbytes(t)[1] for t in outs)
            k = Kernel("mem", [name], bytes_fp32=fp + ofp + src_bytes, bytes_int=it)
            self._new_kernel(k, outs)
            return
        # element-wise (or anything else): fuse into the producer kernel, or stand alone with fusion="none"
        fp, it = self._outside_bytes(ins)
        ofp = sum(_nbytes(t)[0] for t in outs[:1])
        src = self._src(ins)
        if self.fusion in ("none", "torch"):
            src_bytes = sum(_nbytes(t)[0] for t in ins if id(t) in self.producer)
            k = Kernel("mem", [name], bytes_fp32=fp + ofp + src_bytes, bytes_int=it)
            self.kernels.append(k)
            self._mark(outs, len(self.kernels) - 1)
            return
        if src is None or src == -1:
            self.pending_fp += fp
            self.pending_int += it
            self.pending_names.append(name)
            self._mark(outs, -1)
            return
        k = self.kernels[src]
        k.names.append(name)
        k.bytes_fp32 += fp
        k.bytes_int += it
        self._mark(outs, src)

    def _gemm(self, name: str, args, ins, outs) -> Kernel:
        fp, it = self._outside_bytes(ins)
        # inputs produced inside the op are read from DRAM too (they were written by an earlier kernel)
        fp += sum(_nbytes(t)[0] for t in ins if id(t) in self.producer and self.producer[id(t)] >= 0)
        ofp = _nbytes(outs[0])[0]
        if name == "mm":
            a, b = args[0], args[1]
            B, M, K, N = 1, a.shape[0], a.shape[1], b.shape[1]
        elif name == "addmm":
            a, b = args[1], args[2]
            B, M, K, N = 1, a.shape[0], a.shape[1], b.shape[1]
        elif name == "bmm":
            a, b = args[0], args[1]
            B, M, K, N = a.shape[0], a.shape[1], a.shape[2], b.shape[2]
        else:  # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
            x, w = args[0], args[1]
            transposed, groups = bool(args[6]), int(args[8])
            o = outs[0]
            n, cout = o.shape[0], o.shape[1]
            M = n * int(np.prod(o.shape[2:]))
            B = groups
            N = cout // groups
            if transposed:  # scatter form: every input pixel x every weight
                cin = x.shape[1]
                flops = 2.0 * n * int(np.prod(x.shape[2:])) * cin * (w.shape[1]) * int(np.prod(w.shape[2:]))
                K = flops / (2.0 * M * cout)
            else:
                K = (x.shape[1] // groups) * int(np.prod(w.shape[2:]))
            names = ["conv_transpose" if transposed else name]
            if self.fusion == "torch" and not transposed:  # a 1x1 convolution with a stride: its own class
                if all(int(v) == 1 for v in w.shape[2:]) and any(int(v) > 1 for v in args[3]):
                    names.append("strided")
            return Kernel(
                "gemm",
                names,
                B=B,
                M=M,
                N=N,
                K=float(K),
                flops=2.0 * B * M * N * K,
                bytes_fp32=fp + ofp,
                bytes_int=it,
            )
        return Kernel(
            "gemm",
            [name],
            B=int(B),
            M=int(M),
            N=int(N),
            K=float(K),
            flops=2.0 * B * M * N * K,
            bytes_fp32=fp + ofp,
            bytes_int=it,
        )

    def finish(self) -> list[Kernel]:
        if self.pending_names:
            if self.kernels:
                k = self.kernels[-1]
                k.names += self.pending_names
                k.bytes_fp32 += self.pending_fp
                k.bytes_int += self.pending_int
            else:
                self.kernels.append(
                    Kernel("mem", self.pending_names, bytes_fp32=self.pending_fp, bytes_int=self.pending_int)
                )
        return self.kernels


def trace_kernels(
    model, batch_size: int, seq_len: int | None = None, fusion: str = "tensorrt"
) -> list[list[Kernel]]:
    """The kernels of every operator of ``model`` (a zoo model built on the ``meta`` device) at one batch size."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        rec: _OpRecorder

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func._overloadpacket.__name__
            # shape-only shortcut: the meta kernel of batch norm is a slow Python decomposition
            if name in _BN_OPS:
                x = args[0]
                out = (torch.empty_like(x), x.new_empty((0,)), x.new_empty((0,)))
            else:
                out = func(*args, **kwargs)
            self.rec.record(name, func, args, kwargs, out)
            return out

    carry = model.example_input(batch_size, seq_len=seq_len, device="meta")
    result = []
    with torch.no_grad():
        for _, mod in model.ops:
            mode = Mode()
            mode.rec = _OpRecorder(fusion)
            with mode:
                carry = mod(carry)
            result.append(mode.rec.finish())
    return result


# --------------------------------------------------------------------------------------------- templates
@dataclass(frozen=True)
class KernelTemplate:
    """A kernel as a function of the batch size ``bs``: the dimension that grows with the batch (``"B"`` or
    ``"M"``, or ``""``) is ``dim1 * bs``; bytes are ``bytes_fixed + bytes_per_sample * bs`` (at FP32)."""

    kind: str
    names: tuple[str, ...]
    B1: int
    M1: int
    N: int
    K: float
    batch_dim: str
    bytes_fixed: float
    bytes_per_sample: float
    int_bytes_per_sample: float
    min_bs: int = 1  # the kernel runs only from this batch size on (fusion="torch": copies batch 1 does not need)

    def dims(self, bs: int) -> tuple[int, int, int, float]:
        B = self.B1 * bs if self.batch_dim == "B" else self.B1
        M = self.M1 * bs if self.batch_dim == "M" else self.M1
        return B, M, self.N, self.K

    def flops(self, bs: int) -> float:
        B, M, N, K = self.dims(bs)
        return 2.0 * B * M * N * K

    def bytes(self, bs: int, precision: str = "fp32") -> float:
        scale = BYTES_PER_ELEMENT[precision] / 4.0
        return (self.bytes_fixed + self.bytes_per_sample * bs) * scale + self.int_bytes_per_sample * bs


def _template(k1: Kernel, k2: Kernel, k3: Kernel, at: tuple[int, int, int] = (1, 2, 3)) -> KernelTemplate:
    """The linear template of one kernel traced at the three batch sizes ``at`` (consecutive integers)."""
    a, b, c = at
    if k1.kind != k2.kind or k1.names != k2.names:
        raise RuntimeError(f"kernel structure changes with the batch size: {k1.names} vs {k2.names}")
    if k1.kind == "gemm":
        if k2.B * a == b * k1.B and k2.M == k1.M:
            dim, B1, M1 = "B", k1.B // a, k1.M
        elif k2.M * a == b * k1.M and k2.B == k1.B:
            dim, B1, M1 = "M", k1.B, k1.M // a
        elif k2.M == k1.M and k2.B == k1.B:
            dim, B1, M1 = "", k1.B, k1.M
        else:
            raise RuntimeError(f"cannot scale GEMM {k1.names}: {k1} vs {k2}")
        if (k1.N, k1.K) != (k2.N, k2.K):
            raise RuntimeError(f"GEMM N/K change with the batch size: {k1.names}")
    else:
        dim, B1, M1 = "", k1.B, k1.M
    per = (k2.bytes_fp32 - k1.bytes_fp32) / (b - a)
    fixed = k1.bytes_fp32 - per * a
    t = KernelTemplate(
        k1.kind, tuple(k1.names), B1, M1, k1.N, k1.K, dim, fixed, per, (k2.bytes_int - k1.bytes_int) / (b - a)
    )
    # the linear form must also predict the third batch size exactly
    if abs(t.bytes(c) - (k3.bytes_fp32 + k3.bytes_int)) > 1e-6 * max(1.0, k3.bytes_fp32) or (
        k1.kind == "gemm" and t.dims(c) != (k3.B, k3.M, k3.N, k3.K)
    ):
        raise RuntimeError(f"kernel {k1.names} is not linear in the batch size")
    return t


def _matches(t: KernelTemplate, k: Kernel, bs: int) -> bool:
    return t.names == tuple(k.names) and abs(t.bytes(bs) - (k.bytes_fp32 + k.bytes_int)) <= 1e-6 * max(
        1.0, k.bytes_fp32) and (t.kind != "gemm" or t.dims(bs) == (k.B, k.M, k.N, k.K))


@lru_cache(maxsize=256)
def op_templates(
    name: str,
    seq_len: int | None = None,
    fusion: str = "tensorrt",
    variant: str = "full",
    image_size: int | None = None,
) -> tuple[tuple[KernelTemplate, ...], ...]:
    """Kernel templates of every operator of zoo model ``name`` (cached). Traced at batch 1, 2 and 3.

    With ``fusion="torch"`` traced at batch 2, 3 and 4, and at batch 1 for the copies torch skips there (a
    reshape of a batch-1 tensor is often a view): a template absent from the batch-1 trace has ``min_bs = 2``."""
    from dvasim.model import zoo

    kwargs = {"image_size": image_size} if image_size else {}
    model = zoo.build(name, variant, device="meta", **kwargs)
    if model.input_kind == "tokens" and seq_len is None:
        raise ValueError(f"{name} needs seq_len")
    if model.input_kind != "tokens":
        seq_len = None
    at = (2, 3, 4) if fusion == "torch" else (1, 2, 3)
    traces = [trace_kernels(model, bs, seq_len, fusion) for bs in at]
    ones = trace_kernels(model, 1, seq_len, fusion) if fusion == "torch" else None
    ops = []
    for i, (o1, o2, o3) in enumerate(zip(*traces, strict=True)):
        if not (len(o1) == len(o2) == len(o3)):
            raise RuntimeError(f"{name}: kernel count changes with the batch size")
        ts = [_template(a, b, c, at) for a, b, c in zip(o1, o2, o3, strict=True)]
        if ones is not None:  # match the batch-1 kernels, in order, to the templates
            rest = list(ones[i])
            for j, t in enumerate(ts):
                if rest and _matches(t, rest[0], 1):
                    rest.pop(0)
                else:
                    ts[j] = replace(t, min_bs=2)
            if rest:
                raise RuntimeError(f"{name}: batch-1 kernels {[k.names for k in rest]} have no template")
        ops.append(tuple(ts))
    return tuple(ops)


# --------------------------------------------------------------------------------------------- timing
def kernel_time_us(kt: KernelTemplate, bs: int, gpu: GPUSpec, params: ModelParams, precision: str) -> float:
    """Time of one kernel at batch size ``bs`` (microseconds)."""
    t_mem = kt.bytes(bs, precision) / (gpu.dram_gbs * 1e9 * params.mem_eff) * 1e6
    t_comp = 0.0
    if kt.kind == "gemm" and not (params.gemv and kt.dims(bs)[:2] == (1, 1) and kt.names[0] in ("mm", "addmm")):
        B, M, N, K = kt.dims(bs)
        conv = "convolution" in kt.names or "conv_transpose" in kt.names
        eff = params.eff_for(kt.names)
        if conv and params.conv_n_half > 0:
            eff *= N / (N + params.conv_n_half)
        p = params if eff == params.compute_eff else replace(params, compute_eff=eff)
        k_ns = params.conv_k_latency_ns if conv else params.gemm_k_latency_ns
        t_comp = params.gemm_latency_us + _gemm_compute_us(B, M, N, K, gpu, p, precision, k_ns)
    if params.additive_t0:
        return params.kernel_overhead_us + max(t_comp, t_mem)
    return max(params.kernel_overhead_us, t_comp, t_mem)


def _gemm_compute_us(
    B: int, M: int, N: int, K: float, gpu: GPUSpec, params: ModelParams, precision: str, k_latency_ns: float = 0.0
) -> float:
    """Wave-quantised GEMM time; split-K (the reduction cut into ``sk`` parts, partial sums added by an
    extra pass over ``sk * M * N`` values) is used when it is faster and every part keeps a reduction
    length of at least ``max(M, N, 256)`` (split-K only pays off for long, thin reductions). A block's
    reduction loop adds ``k_latency_ns`` per element of its (split) reduction."""
    b = params.block
    bn = N if params.narrow_tiles and N < b else b
    slots = gpu.sms * params.blocks_per_sm
    per_slot = gpu.peak_flops(precision) * params.compute_eff / slots
    bw = gpu.dram_gbs * 1e9 * params.mem_eff
    best = math.inf
    sk = 1
    while sk == 1 or (params.split_k and K / sk >= max(M, N, 256)):
        blocks = B * math.ceil(M / b) * math.ceil(N / bn) * sk
        waves = math.ceil(blocks / slots)
        t = waves * (2.0 * b * bn * K / sk) / per_slot + K / sk * k_latency_ns * 1e-9
        if sk > 1:
            t += 2.0 * sk * B * M * N * BYTES_PER_ELEMENT[precision] / bw
        best = min(best, t)
        sk *= 2
    return best * 1e6


def _resolve(gpu: str | GPUSpec, params: ModelParams | str | None, precision: str | None):
    g = GPUS[gpu] if isinstance(gpu, str) else gpu
    if params is None:
        params = PARAMS[g.key]
    elif isinstance(params, str):
        params = PARAMS[params]
    return g, params, precision or DEFAULT_PRECISION[g.key]


def op_latencies_ms(
    name: str,
    batch_sizes: Iterable[int],
    seq_len: int | None = None,
    gpu: str | GPUSpec = "titanrtx",
    params: ModelParams | str | None = None,
    precision: str | None = None,
    variant: str = "full",
    image_size: int | None = None,
) -> np.ndarray:
    """Modelled latency (ms) of every operator: array ``[n_ops, len(batch_sizes)]``."""
    g, p, prec = _resolve(gpu, params, precision)
    ops = op_templates(name, seq_len, p.fusion, variant, image_size)
    bss = list(batch_sizes)
    out = np.zeros((len(ops), len(bss)))
    for i, kernels in enumerate(ops):
        for j, bs in enumerate(bss):
            out[i, j] = sum(kernel_time_us(k, bs, g, p, prec) for k in kernels if bs >= k.min_bs) / 1e3
    return out


def model_latency_ms(name: str, batch_sizes: Iterable[int], **kwargs) -> np.ndarray:
    """Modelled end-to-end latency (ms) of the whole model, one value per batch size."""
    return op_latencies_ms(name, batch_sizes, **kwargs).sum(axis=0)


def gemm_latency_ms(
    m_per_sample: int,
    n: int,
    k: int,
    batch_sizes: Iterable[int],
    gpu: str | GPUSpec = "titanrtx",
    params: ModelParams | str | None = None,
    precision: str | None = None,
) -> np.ndarray:
    """Modelled latency of a GEMM ``[bs * m_per_sample, k] x [k, n]`` (inputs, weights and output in DRAM)."""
    g, p, prec = _resolve(gpu, params, precision)
    per = 4.0 * (m_per_sample * k + m_per_sample * n)
    kt = KernelTemplate("gemm", ("mm",), 1, m_per_sample, n, float(k), "M", 4.0 * k * n, per, 0.0)
    return np.array([kernel_time_us(kt, bs, g, p, prec) / 1e3 for bs in batch_sizes])


def preferred_batch_size(
    batch_sizes: Sequence[int], latencies: Sequence[float], threshold: float = 0.9
) -> int:
    """DVABatch's preferred batch size: the smallest batch size whose throughput ``bs / latency`` reaches
    ``threshold`` of the best throughput over ``batch_sizes`` (same definition as ``LatencyTable``)."""
    bs = np.asarray(batch_sizes, dtype=float)
    thr = bs / np.asarray(latencies, dtype=float)
    ok = np.nonzero(thr >= threshold * thr.max())[0]
    return int(bs[ok[0]])


def with_params(params: ModelParams, **changes) -> ModelParams:
    """A copy of ``params`` with some fields changed (for fitting and what-if studies)."""
    return replace(params, **changes)
