"""Derive traces/arrivals/<name>.csv.gz (real request arrival times + token counts) from public LLM traces.

Run by a human from the repository root (it reads the shared data directory, which the project never reads
at run or test time):

    .venv/bin/python traces/derive/derive_arrival_traces.py [path/to/shared/data/traces] [--out traces/arrivals]

Each output is a gzip-compressed CSV (gzip mtime 0, so re-running gives identical bytes) starting with
``# key: value`` provenance lines, then the columns

* ``arrival_ms``: the request's arrival time in ms after the trace's first request (sorted, first row 0);
* ``prompt_tokens``: the request's input (prompt / context) token count as given by the source;
* ``output_tokens``: the request's generated (output) token count as given by the source;
* ``bert_seq_len``: ``min(prompt_tokens, 512)``, the prompt truncated at BERT's 512-token maximum input, so
  that the shipped BERT latency tables (profiled up to seq_len 512) can use the trace's lengths. The source
  counts come from the LLMs' own tokenizers, not BERT WordPiece: this is a modelled input length.

Traces (one row per request, in source order, which is already sorted by time; the script checks it):

* ``azure_code``, ``azure_conv``: Azure LLM inference traces 2023 (``AzureLLMInferenceTrace_{code,conv}.csv``,
  columns TIMESTAMP, ContextTokens, GeneratedTokens). TIMESTAMP strings (7 fractional digits, the last always 0)
  are parsed exactly to microseconds; ``arrival_ms`` keeps 3 decimals (1 us, exact).
* ``mooncake_conversation``: Mooncake (FAST'25) conversation trace (``conversation_trace.jsonl``, fields
  timestamp (ms), input_length, output_length, hash_ids). Its timestamps are already ms from the first request
  and rounded to about 3 s in the source (most gaps are 0): bursts are an artefact of that rounding.
  ``hash_ids`` (prefix-cache block ids) are dropped.

The script checks each output against the source summary ``trace_summary.csv`` (rows, span, mean context /
input tokens) and aborts on a mismatch.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import io
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SRC = REPO.parent / "shared/data/traces"
DEFAULT_OUT = REPO / "traces/arrivals"
BERT_MAX_LEN = 512

AZURE_SOURCE = "Azure/AzurePublicDataset data/{file} (commit 790921015d50dd6aae7f7e47f39ba0e235ad6b08)"
AZURE_LICENCE = (
    "CC-BY-4.0; attribution: Azure Public Dataset (https://github.com/Azure/AzurePublicDataset), "
    "Azure LLM inference trace 2023; modified: times made relative, a truncated length column added"
)
MOONCAKE_SOURCE = "kvcache-ai/Mooncake FAST25-release/traces/{file} (commit 3cca71daccf2a7afb8fe3f0295358f70e3a69fdb)"
MOONCAKE_LICENCE = "Apache-2.0 (Mooncake repository LICENSE-APACHE); modified: hash_ids dropped, a truncated length column added"

TRACES: dict[str, dict] = {
    "azure_code": dict(file="azure_llm_2023/AzureLLMInferenceTrace_code.csv", kind="azure",
                       summary="azure_llm_2023_code",
                       what="Azure LLM inference trace 2023, code-completion service, one hour (2023-11-16)"),
    "azure_conv": dict(file="azure_llm_2023/AzureLLMInferenceTrace_conv.csv", kind="azure",
                       summary="azure_llm_2023_conv",
                       what="Azure LLM inference trace 2023, conversation (chat) service, one hour (2023-11-16)"),
    "mooncake_conversation": dict(file="mooncake_fast25/conversation_trace.jsonl", kind="mooncake",
                                  summary="mooncake_fast25_conversation",
                                  what="Mooncake (Kimi) conversation trace, sampled from one hour of online "
                                       "requests; timestamps rounded to about 3 s in the source"),
}


def _azure_us(stamps: pd.Series) -> np.ndarray:
    """Microseconds since the first stamp, exactly (the source has 7 fractional digits, the last always 0)."""
    s = stamps.astype(str).str.strip()
    assert (s.str.len() == 27).all() and (s.str[-1] == "0").all(), "unexpected TIMESTAMP format"
    t = pd.to_datetime(s.str[:-1], format="%Y-%m-%d %H:%M:%S.%f")  # 6 fractional digits: exact us
    ns = t.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    return (ns - ns[0]) // 1000


def derive(name: str, spec: dict, src: Path) -> tuple[pd.DataFrame, dict[str, str], str]:
    path = src / spec["file"]
    if spec["kind"] == "azure":
        raw = pd.read_csv(path, dtype={"TIMESTAMP": str})
        assert list(raw.columns) == ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], raw.columns
        us = _azure_us(raw["TIMESTAMP"])
        arrival = [f"{u // 1000}.{u % 1000:03d}" for u in us]  # exact decimal ms
        prompt = raw["ContextTokens"].to_numpy(np.int64)
        output = raw["GeneratedTokens"].to_numpy(np.int64)
        span_s = us[-1] / 1e6
        source, licence = AZURE_SOURCE.format(file=Path(spec["file"]).name), AZURE_LICENCE
        times = "arrival_ms = TIMESTAMP minus the first TIMESTAMP, in ms (exact to 1 us)"
    else:
        raw = pd.read_json(path, lines=True)
        assert {"timestamp", "input_length", "output_length"} <= set(raw.columns), raw.columns
        ms = raw["timestamp"].to_numpy(np.int64)
        arrival = (ms - ms[0]).astype(str).tolist()
        prompt = raw["input_length"].to_numpy(np.int64)
        output = raw["output_length"].to_numpy(np.int64)
        span_s = (ms[-1] - ms[0]) / 1e3
        source, licence = MOONCAKE_SOURCE.format(file=Path(spec["file"]).name), MOONCAKE_LICENCE
        times = "arrival_ms = timestamp (ms) minus the first timestamp; source rounded to about 3 s"
    t = np.asarray(arrival, dtype=np.float64)
    if np.any(np.diff(t) < 0):
        raise SystemExit(f"{name}: source is not sorted by time")
    if prompt.min() < 1 or output.min() < 0:
        raise SystemExit(f"{name}: token counts out of range (prompt min {prompt.min()}, output min {output.min()})")
    df = pd.DataFrame({
        "arrival_ms": arrival,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "bert_seq_len": np.minimum(prompt, BERT_MAX_LEN),
    })
    check = _check_summary(name, spec["summary"], src, len(df), span_s, prompt)
    rate = (len(df) - 1) / span_s
    header = {
        "source": source,
        "licence": licence,
        "trace": spec["what"],
        "columns": (
            f"{times}; prompt_tokens, output_tokens = the source's input / generated token counts (LLM tokenizer); "
            f"bert_seq_len = min(prompt_tokens, {BERT_MAX_LEN}) (modelled: BERT's maximum input, not a BERT tokenization)"
        ),
        "rows": str(len(df)),
        "span_ms": f"{t[-1]:.3f}",
        "mean_rate_qps": f"{rate:.4f}",
        "check": check,
        "derived_by": "traces/derive/derive_arrival_traces.py",
        "date": datetime.date.today().isoformat(),
    }
    return df, header, f"{len(df)} rows, span {span_s:.1f} s, {rate:.3f} QPS, {check}"


def _check_summary(name: str, key: str, src: Path, rows: int, span_s: float, prompt: np.ndarray) -> str:
    summary = pd.read_csv(src / "trace_summary.csv").set_index("trace")
    row = summary.loc[key]
    col = "ctx_tokens_mean" if pd.notna(row.get("ctx_tokens_mean")) else "input_tokens_mean"
    got = {"rows": rows, "span_s": round(float(span_s), 3), col: round(float(prompt.mean()), 2)}
    for k, v in got.items():
        want = float(row[k])
        if abs(v - want) > 1e-6 * max(1.0, abs(want)):
            raise SystemExit(f"{name}: {k} = {v} but trace_summary.csv says {want}")
    said = ", ".join(f"{k} {v}" for k, v in got.items())
    return f"rows, span and mean prompt tokens match shared/data/traces/trace_summary.csv ({said})"


def write(path: Path, df: pd.DataFrame, header: dict[str, str]) -> None:
    text = io.StringIO()
    for k, v in header.items():
        text.write(f"# {k}: {' '.join(str(v).split())}\n")
    df.to_csv(text, index=False, lineterminator="\n")
    with path.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
        gz.write(text.getvalue().encode("utf-8"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", default=str(DEFAULT_SRC))
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    src, out = Path(args.src), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, spec in TRACES.items():
        df, header, msg = derive(name, spec, src)
        path = out / f"{name}.csv.gz"
        write(path, df, header)
        print(f"{name}: {msg} -> {path} ({path.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
