"""Print the requirements of the named optional-dependency groups of pyproject.toml, one a line, for
``pip install -r``: ``make test`` installs the dev and replay extras this way, so the package that ``make run``
installed (and compiled) is not built a second time.

    python tools/extras.py dev replay > reqs.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: pip's own copy of the same parser
    from pip._vendor import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def requirements(groups: list[str]) -> list[str]:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    unknown = [g for g in groups if g not in extras]
    if unknown:
        raise SystemExit(f"extras.py: no extra {unknown[0]!r} in pyproject.toml; there are {', '.join(extras)}")
    return [req for g in groups for req in extras[g]]


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:])))
