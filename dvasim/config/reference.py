"""The config reference and the help, rendered from the schema (:data:`dvasim.config.sections.SCHEMA`): what
``docs/config.md`` holds (``dvasim config --reference > docs/config.md``, which adds the sweep file's sections; a
test checks it is current) and what ``dvasim config [SECTION]`` prints."""

from __future__ import annotations

import math

from dvasim.config.sections import SCHEMA, SUBSECTIONS
from dvasim.schema import Key, Section

HEADER = """# Config reference

Generated from the schema (`dvasim/config/sections.py` and the sections it assembles, and the sweep file's in
`dvasim/studies/sweep.py`) by `dvasim config --reference > docs/config.md`; `tests/config/test_config_schema.py` checks
it is current.
`dvasim config [SECTION]` prints the same. Any key can be set from the command line:
`--set section.key=value` (`--set engine.host.cores=8` for a sub-table), `--set section={...}` replaces a whole
section, `--set section.key` removes a key.
"""


def _default(k: Key) -> str:
    if not k.has_default or k.default is None:
        return ""
    v = k.default
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return f"{v:g}" if isinstance(v, float) else str(v)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def section_markdown(section: Section, level: int = 2) -> str:
    lines = [f"{'#' * level} [{section.name}]", "", section.help[0].upper() + section.help[1:] + ".", ""]
    kinds = section.selector is not None
    head = "| key | accepts | default | " + ("for kind | " if kinds else "") + "meaning |"
    lines += [head, "|" + " --- |" * (4 + kinds)]
    for k in section.keys:
        where = (", ".join(k.kinds) if k.kinds else "any") if kinds else None
        cells = [f"`{k.name}`", _cell(k.range_text()), _cell(_default(k)), *([where] if kinds else []),
                 _cell(k.help)]
        lines.append("| " + " | ".join(cells) + " |")
    if section.open:
        lines += ["", f"Other keys: {section.open_help}."]
    return "\n".join(lines) + "\n"


def policies_markdown() -> str:
    """Each policy's parameters, from the policy's own declaration."""
    from dvasim.policies.base import policy_names, policy_reference

    lines = ["### The policies' parameters", ""]
    for name in policy_names():
        ref = policy_reference(name)
        alias = f" (also {', '.join(f'`{a}`' for a in ref['aliases'])})" if ref["aliases"] else ""
        lines += [f"#### `{name}`{alias}", "", _cell(ref["summary"]), ""]
        if ref["params"]:
            lines += ["| key | default | meaning |", "| --- | --- | --- |"]
            for key, p in ref["params"].items():
                default = "" if p["default"] is None else _cell(repr(p["default"]))
                lines.append(f"| `{key}` | {default} | {_cell(p['help'])} |")
            lines.append("")
    return "\n".join(lines)


def reference_markdown() -> str:
    parts = [HEADER]
    for name, section in SCHEMA.items():
        parts.append(section_markdown(section))
        if name == "policy":
            parts.append(policies_markdown())
        for sub, s in SUBSECTIONS.items():
            if sub.startswith(name + "."):
                parts.append(section_markdown(s, level=3))
    return "\n".join(parts).rstrip() + "\n"


def section_help(section: Section) -> str:
    """``dvasim config SECTION``'s text: each key with its default, what it accepts and its help."""
    out = []
    for s in [section]:
        out.append(f"[{s.name}]  {s.help}")
        for k in s.keys:
            d = _default(k)
            extra = f" [{d}]" if d else ""
            if s.selector and k.kinds:
                extra += f" (kind: {', '.join(k.kinds)})"
            out.append(f"  {k.name}{extra}: {k.range_text()}. {k.help}")
        if s.open:
            out.append(f"  ...: {s.open_help} (dvasim policies NAME)")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
