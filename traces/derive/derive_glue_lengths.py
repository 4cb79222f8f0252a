"""Derive traces/glue/<TASK>.csv (per-example BERT input lengths) from GLUE dev-set TSVs.

Run by a human from the repository root (it reads the shared data directory, which the project never reads
at run or test time):

    .venv/bin/python traces/derive/derive_glue_lengths.py [path/to/shared/data/glue] [--out traces/glue]

For every example, ``words`` = number of whitespace-separated tokens (Python ``str.split``) of its text
field(s), summed over both sentences for pair tasks, and ``seq_len`` = ``words`` + the BERT special tokens:
2 for single sentences (``[CLS] s [SEP]``), 3 for pairs (``[CLS] a [SEP] b [SEP]``).

This is a whitespace-word APPROXIMATION of BERT's WordPiece token count: no tokenizer vocabulary is available
offline. WordPiece splits rare words and punctuation into several pieces, so real BERT inputs are somewhat
longer; the shape of the distribution (its diversity, which is what DVABatch exploits)
is what matters here.

The script checks its word counts against the summary ``glue_lengths.csv`` shipped next to the TSVs
(n_examples, mean, p50, p90, p99 and max must match to the summary's 2 decimals) and aborts otherwise.
Files are read as raw tab-separated lines (no CSV quote processing: GLUE texts contain unbalanced quotes).
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SRC = REPO.parent / "shared/data/glue"
DEFAULT_OUT = REPO / "traces/glue"

# task -> (file, has header row, text column indices, expected #fields, source, licence)
TASKS: dict[str, dict] = {
    "CoLA": dict(
        file="CoLA/dev.tsv", header=False, cols=[3], names="sentence (4th field; file has no header)", nf=4,
        source="Nstats/my_bert data/CoLA/dev.tsv (commit 44c152c8e3d84720112dd92fc7e1b767b3b0558c)",
        licence="CoLA: see the CoLA dataset terms (GLUE defers to each source dataset); repo Apache-2.0",
    ),
    "SST-2": dict(
        file="SST-2/dev.tsv", header=True, cols=[0], names="sentence", nf=2,
        source="forest-snow/alps data/SST-2/test.tsv = GLUE SST-2 dev (commit 43232f23)",
        licence="SST: see the Stanford Sentiment Treebank terms (GLUE defers to each source dataset); repo MIT",
    ),
    "MRPC": dict(
        file="MRPC/dev.tsv", header=True, cols=[3, 4], names="#1 String + #2 String", nf=5,
        source="Nstats/my_bert data/MRPC/dev.tsv (commit 44c152c8e3d84720112dd92fc7e1b767b3b0558c)",
        licence="MRPC: Microsoft Research Paraphrase Corpus terms (GLUE defers to each source dataset); repo Apache-2.0",
    ),
    "STS-B": dict(
        file="STS-B/dev.tsv", header=True, cols=[7, 8], names="sentence1 + sentence2", nf=10,
        source="korjak/sts-dev data/STS-B/dev.tsv (commit 2188b0e262587c4a55fbd6ca92a103f0addd198f)",
        licence="STS-B LICENSE.txt: scores CC BY-SA 4.0, texts under per-source licences",
    ),
    "QNLI": dict(
        file="QNLI/dev.tsv", header=True, cols=[1, 2], names="question + sentence", nf=4,
        source="jonny-vr/LLMCBench data/QNLI/dev.tsv (commit 604196786d0e25179e3553ee67e221317230c496)",
        licence="QNLI (from SQuAD, CC BY-SA 4.0); repo MIT",
    ),
    "RTE": dict(
        file="RTE/dev.tsv", header=True, cols=[1, 2], names="sentence1 + sentence2", nf=4,
        source="amrnag/Specialized-Transformers data/RTE/dev.tsv (commit cae3514a52b66977974bfedd7ecc2efd029a72e9)",
        licence="RTE: see the RTE challenge terms (GLUE defers to each source dataset); repo has no licence file",
    ),
    "WNLI": dict(
        file="WNLI/dev.tsv", header=True, cols=[1, 2], names="sentence1 + sentence2", nf=4,
        source="amrnag/Specialized-Transformers data/WNLI/dev.tsv (commit cae3514a52b66977974bfedd7ecc2efd029a72e9)",
        licence="WNLI: Winograd Schema data's own terms (GLUE defers to each source dataset); repo has no licence file",
    ),
    "QQP": dict(
        file="QQP/new_dev_cutoff_resplit.tsv", header=False, cols=[3, 4],
        names="question1 + question2 (4th and 5th fields; file has no header)", nf=6,
        source="mieseung/Cutoff_with_Attribution glue_data/QQP/new_dev.tsv (commit a618baaed9a64f091a338b8c69f89dc231a6f0b7); "
        "NOT the official GLUE QQP dev set but the authors' re-split",
        licence="QQP: Quora Question Pairs terms (non-commercial); repo has no licence file",
    ),
}


# header names that hold text in the GLUE TSVs (checked against each file's header row)
TEXT_HEADERS = {"sentence", "#1 String", "#2 String", "sentence1", "sentence2", "question"}


def task_words(path: Path, header: bool, cols: list[int], nf: int) -> tuple[np.ndarray, list[int]]:
    """Word counts per example; also the (1-based) line numbers of malformed rows that were skipped."""
    text = path.read_text(encoding="utf-8-sig")  # MRPC starts with a BOM
    lines = [ln for ln in text.split("\n") if ln.strip() != ""]
    first = 1 if header else 0
    if header:  # the text columns are identified by name in the header row
        names = lines[0].rstrip("\r").split("\t")
        assert all(names[c] in TEXT_HEADERS for c in cols), f"{path}: unexpected header {names}"
    words, skipped = [], []
    for i, line in enumerate(lines[first:], start=first + 1):
        fields = line.rstrip("\r").split("\t")
        if len(fields) != nf:
            skipped.append(i)
            continue
        words.append(sum(len(fields[c].split()) for c in cols))
    return np.asarray(words, dtype=np.int64), skipped


def check_against_summary(task: str, words: np.ndarray, summary: pd.DataFrame) -> str:
    row = summary[(summary["task"] == task) & (summary["split"] != "dev(hf-export-copy)")].iloc[0]
    got = {
        "n_examples": len(words),
        "mean_words": round(float(words.mean()), 2),
        "p50": round(float(np.percentile(words, 50)), 2),
        "p90": round(float(np.percentile(words, 90)), 2),
        "p99": round(float(np.percentile(words, 99)), 2),
        "max_words": int(words.max()),
    }
    for k, v in got.items():
        want = float(row[k])
        if abs(v - want) > 1e-9:
            raise SystemExit(f"{task}: {k} = {v} but glue_lengths.csv says {want}")
    return f"n={got['n_examples']}, mean words {got['mean_words']}, p50/p90/p99 {got['p50']}/{got['p90']}/{got['p99']}, max {got['max_words']}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", default=str(DEFAULT_SRC))
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    src, out = Path(args.src), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = pd.read_csv(src / "glue_lengths.csv")
    today = datetime.date.today().isoformat()
    for task, t in TASKS.items():
        words, skipped = task_words(src / t["file"], t["header"], t["cols"], t["nf"])
        check = check_against_summary(task, words, summary)
        pair = len(t["cols"]) == 2
        special = 3 if pair else 2
        seq = words + special
        note_skip = (
            f"; skipped {len(skipped)} malformed row(s) (line(s) {skipped}: wrong number of tab-separated fields)"
            if skipped else ""
        )
        header = {
            "source": t["source"],
            "licence": t["licence"] + "; only per-example token counts (no text) are redistributed here",
            "task": f"GLUE {task} dev ({'sentence pair' if pair else 'single sentence'}), text field(s): {t['names']}",
            "approximation": (
                "seq_len = whitespace words (str.split) of the text field(s) + "
                + ("3 special tokens ([CLS] a [SEP] b [SEP])" if pair else "2 special tokens ([CLS] s [SEP])")
                + "; an approximation of BERT WordPiece tokens (no tokenizer vocabulary offline), real counts are longer"
            ),
            "check": f"word counts match shared/data/glue/glue_lengths.csv exactly ({check}){note_skip}",
            "derived_by": "traces/derive/derive_glue_lengths.py",
            "date": today,
        }
        path = out / f"{task}.csv"
        with path.open("w", encoding="utf-8") as fh:
            for k, v in header.items():
                fh.write(f"# {k}: {v}\n")
            pd.DataFrame({"seq_len": seq, "words": words}).to_csv(fh, index=False, lineterminator="\n")
        print(f"{task}: {check}; seq_len mean {seq.mean():.2f} max {seq.max()}{note_skip} -> {path}")


if __name__ == "__main__":
    main()
