"""The documentation site (issue 37): ``mkdocs build --strict`` passes, so no broken link, unknown anchor, page
left out of the nav or API page griffe cannot load reaches the site; the README stays a short front door with the
two quickstart commands; every page in ``docs/`` is in the nav."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _nav_pages(nav) -> list[str]:
    """Every page path the nav names, depth first."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in _nav_pages(v)]
    return [p for item in nav or [] for p in _nav_pages(item)]


def _nav() -> list[str]:
    # mkdocs.yml holds no YAML tags, so a plain safe_load reads it (pyyaml comes with mkdocs)
    yaml = pytest.importorskip("yaml")
    return _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])


def test_the_readme_is_a_short_front_door_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 220, "the README is the front door: move detail into docs/"
    quick = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"^make run +# ", quick, re.M) and re.search(r"^make test +# ", quick, re.M)
    assert "](experiments/results/compare/fig16_p99_latency.png)" in text
    assert (ROOT / "experiments/results/compare/fig16_p99_latency.png").is_file()
    for link in re.findall(r"\]\(((?:docs|experiments|traces)/[^)#]+)", text):  # the README's links resolve in the checkout
        assert (ROOT / link).exists(), link
    for path in re.findall(r"\b(configs/[\w/]+\.toml)\b", text):  # and the shipped configs its commands name
        assert (ROOT / path).is_file(), path


def test_the_quickstart_is_the_same_in_the_readme_and_the_docs():
    """The two commands with their timings, word for word: a re-measured timing is updated in both."""
    def block(path: Path) -> str:
        return re.search(r"```bash\n(make run .*?)```", path.read_text(encoding="utf-8"), re.S).group(1)
    assert block(ROOT / "README.md") == block(DOCS / "getting-started.md")


def test_the_python_example_is_the_same_in_the_readme_and_the_docs():
    """tests/test_install.py runs the README's; the docs' copy must not drift from it."""
    def block(path: Path) -> str:
        return re.search(r"From Python:\s*```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S).group(1)
    assert block(ROOT / "README.md") == block(DOCS / "tasks" / "run.md")


def test_every_docs_page_is_in_the_nav():
    nav = set(_nav())
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - nav == set(), "add these pages to mkdocs.yml's nav"
    # the rest of the nav is rendered from the repository's READMEs at build time (docs/hooks/mirror.py)
    mirror = _mirror()
    mirrored = set(mirror.PAGES) | {p for p, _, _ in mirror.experiment_pages()}
    assert nav - pages - mirrored == set(), "the nav names pages that do not exist"
    assert all((ROOT / src).is_file() for src in [*mirror.PAGES.values(), *mirror.ASSETS.values()])


def _mirror():
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import mirror
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    return mirror


def test_mirrored_readmes_keep_their_links_valid_on_the_site():
    """A README's relative link works on GitHub; on the site it goes to the mirrored page, an image is served with
    the site, another repository file becomes its path as code, and a missing file stays a link (the build fails)."""
    mirror, assets = _mirror(), {}
    text = ("[t](../traces/README.md) ![f](results/compare/fig16_p99_latency.png) [c](common.py) [s](#a-section) "
            "[w](https://example.org) [gone](no_such_file.md)\n```\n[kept](common.py)\n```")
    out = mirror.relink(text, "experiments/README.md", "experiments/fig15-stepping.md", assets)
    assert out.splitlines()[0] == ("[t](../data/traces.md) ![f](../repo/experiments/results/compare/fig16_p99_latency.png) "
                                   "c (`experiments/common.py`) s [w](https://example.org) [gone](no_such_file.md)")
    assert "[kept](common.py)" in out
    assert assets == {"repo/experiments/results/compare/fig16_p99_latency.png":
                      "experiments/results/compare/fig16_p99_latency.png"}


def test_the_experiments_split_keeps_every_line():
    """Each ``## `` section of experiments/README.md becomes one page; no line is lost (headings in code fences
    stay where they are)."""
    mirror = _mirror()
    text = (ROOT / "experiments" / "README.md").read_text(encoding="utf-8")
    head, sections = mirror.split_sections(text)
    assert len(sections) == sum(1 for line in text.splitlines() if line.startswith("## "))
    body = "\n".join([head] + [f"{t}\n{b}" for t, b in sections])
    words = lambda s: re.sub(r"[#\s]+", " ", s).split()  # noqa: E731
    assert words(body) == words(text)


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
                    reason="mkdocs and mkdocstrings are dev extras (pip install -e '.[dev]')")
def test_the_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``: a warning (a broken link or anchor, a page not in the nav, an API object griffe
    cannot load) fails it. The build took 4.3 s, and 6.5-7.9 s beside other work, on the shared 2-core VM
    (2026-11-29)."""
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    site = tmp_path / "site"
    assert (site / "index.html").is_file() and (site / "img" / "fig16_p99_latency.png").is_file()
    assert 'id="dvasim.api.run"' in (site / "api" / "run" / "index.html").read_text(encoding="utf-8")
    assert (site / "experiments" / "fig15-stepping" / "index.html").is_file()
