"""MkDocs hook: the repository's own READMEs as pages of the site, read at build time (no copy to drift).

The experiments (``experiments/README.md``) are split at their ``## `` sections, one page each, listed in the nav
after ``experiments/index.md``; the other READMEs in :data:`PAGES` become one page each. The front door's figure
is served from ``experiments/results/compare/``. Every mirrored page passes the same strict checks as the written
ones (``mkdocs build --strict``). Loaded by ``hooks:`` in ``mkdocs.yml``; excluded from the site itself.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]

# site page -> repository file, mirrored whole
PAGES = {
    "data/traces.md": "traces/README.md",
    "data/gpu-tables.md": "traces/gpu/README.md",
    "data/h100-measured.md": "traces/gpu/h100/measured/README.md",
    "data/cpu-tables.md": "traces/cpu/README.md",
    "data/h100-replays.md": "traces/h100_replays/README.md",
    "data/published-gpu.md": "traces/validation/README.md",
    "data/gpu-matrix-h200.md": "traces/gpu_matrix/h200_2026-11-28/README.md",
    "gpu/matrix-results.md": "experiments/validation/gpu/README.md",
    "gpu/h100-fit.md": "experiments/h100_fit/README.md",
    "gpu/cpu-fidelity.md": "experiments/validation/README.md",
    "gpu/triton-cpu.md": "experiments/validation/triton/README.md",
    "gpu/triton-release-2410.md": "experiments/validation/triton/release_24.10.md",
}
# site file -> repository file, served as is
ASSETS = {
    "img/fig16_p99_latency.png": "experiments/results/compare/fig16_p99_latency.png",
}
EXPERIMENTS = "experiments/README.md"
# a section of experiments/README.md whose title starts so -> its page's name (stable links while titles are edited);
# a section not listed gets a name from its title
NAMES = {
    "Answers that hold in a long run": "long-run",
    "The paper rerun three ways": "paper-rerun",
    "Figures 14 and 16": "fig14-16-compare",
    "Figure 15": "fig15-stepping",
    "Figure 17": "fig17-glue",
    "Figure 18": "fig18-split",
    "Figure 19": "fig19-buffer-pairs",
    "Figure 20": "fig20-stages",
    "Figure 21": "fig21-closed-loop",
    "On a real GPU": "h100-fit",
    "Left undone": "caveats",
    "Policy III's threshold": "policy3-threshold",
    "The characterization study's Table 5": "study-table5",
    "The characterization study's Tables 2-4": "study-tables2-4",
    "E2bird": "e2bird",
    "LazyBatching": "lazybatching",
    "One question under each serving stack": "stack-question",
}
EXPERIMENTS_INDEX = "experiments/index.md"
FENCE = re.compile(r"^\s*(```|~~~)")
_state: dict = {}


def _note(src: str) -> str:
    return (f"\n\n---\n\n*This page is `{src}` of the repository, rendered at build time; edit it there.*\n")


LINK = re.compile(r'(!?)\[([^\]]*)\]\(([^)\s]+)((?:\s+"[^"]*")?)\)')


def relink(text: str, src: str, page: str, assets: dict[str, str]) -> str:
    """Rewrite the relative links of ``src`` (a repository file) for its site page ``page``: a link to another
    mirrored README goes to its page, an image is served from ``repo/<its path>`` (added to ``assets``), a link to any
    other file of the repository becomes its path as code (the site holds no such page), and an anchor-only link on
    a page split from a longer file becomes plain text. A link to a path that does not exist is left as it is, so the
    strict build fails on it."""
    sources = {v: k for k, v in PAGES.items()} | {EXPERIMENTS: EXPERIMENTS_INDEX}
    split = src == EXPERIMENTS

    def one(m: re.Match) -> str:
        bang, label, target, title = m.groups()
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            return m.group(0)
        if target.startswith("#"):
            return label if split else m.group(0)
        path, _, anchor = target.partition("#")
        repo = posixpath.normpath(posixpath.join(posixpath.dirname(src), path))
        here = posixpath.dirname(page) or "."
        if repo.startswith("../"):
            return f"{label} (`{path}`)" if not bang else f"`{path}`"
        if repo in sources:
            rel = posixpath.relpath(sources[repo], here)
            keep = f"#{anchor}" if anchor and sources[repo] != EXPERIMENTS_INDEX else ""
            return f"{bang}[{label}]({rel}{keep}{title})"
        if bang and (ROOT / repo).is_file():
            assets[f"repo/{repo}"] = repo
            return f"{bang}[{label}]({posixpath.relpath('repo/' + repo, here)}{title})"
        if (ROOT / repo).exists():
            return f"{label} (`{repo}`)" if label and not bang else f"`{repo}`"
        return m.group(0)

    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        out.append(line if fenced else LINK.sub(one, line))
    return "\n".join(out)


def split_sections(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The text before the first ``## `` heading, and each ``## `` section as (title, body) with its headings
    promoted one level (``##`` -> ``#``); lines inside code fences are never taken for headings."""
    head: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            sections.append((line[3:].strip(), []))
            continue
        if not fenced and sections and re.match(r"^#{3,6} ", line):
            line = line[1:]
        (sections[-1][1] if sections else head).append(line)
    return "\n".join(head), [(t, "\n".join(b)) for t, b in sections]


def slug(title: str) -> str:
    for prefix, name in NAMES.items():
        if title.startswith(prefix):
            return name
    s = re.sub(r"[^a-z0-9]+", "-", title.lower().replace("`", "")).strip("-")
    return s[:60].rstrip("-") or "section"


def experiment_pages() -> list[tuple[str, str, str]]:
    """(site path, nav title, Markdown) for the experiments' index and each section."""
    head, sections = split_sections((ROOT / EXPERIMENTS).read_text(encoding="utf-8"))
    pages, seen = [], set()
    for title, body in sections:
        name = slug(title)
        while name in seen:
            name += "-2"
        seen.add(name)
        pages.append((f"experiments/{name}.md", re.sub(r"[`*]", "", title), f"# {title}\n{body}" + _note(EXPERIMENTS)))
    index = head + "\n\n## The sections\n\n" + "\n".join(
        f"* [{t}]({Path(p).name})" for p, t, _ in pages) + _note(EXPERIMENTS)
    return [(EXPERIMENTS_INDEX, "Overview", index)] + pages


def _find_list(nav, item):
    """The nav list that holds ``item`` (a page path), searched depth first."""
    if isinstance(nav, list):
        for entry in nav:
            values = entry.values() if isinstance(entry, dict) else [entry]
            if item in values:
                return nav
            for v in values:
                found = _find_list(v, item)
                if found is not None:
                    return found
    return None


def on_config(config, **kw):
    pages = experiment_pages()
    where = _find_list(config["nav"], EXPERIMENTS_INDEX)
    if where is not None:
        where.extend({title: path} for path, title, _ in pages[1:])
    _state["experiments"] = pages
    return config


def on_files(files, config, **kw):
    assets = dict(ASSETS)
    for path, _, text in _state["experiments"]:
        files.append(File.generated(config, path, content=relink(text, EXPERIMENTS, path, assets)))
    for path, src in PAGES.items():
        text = relink((ROOT / src).read_text(encoding="utf-8"), src, path, assets)
        files.append(File.generated(config, path, content=text + _note(src)))
    for path, src in assets.items():
        files.append(File.generated(config, path, abs_src_path=str(ROOT / src)))
    return files
