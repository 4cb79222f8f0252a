"""``dvasim config [SECTION] [--reference]``: every config key a run (or a sweep file) may hold, with its type,
range, default and help, read from the schema; ``--reference`` prints the Markdown reference that
``docs/config.md`` holds (``dvasim config --reference > docs/config.md``)."""

from __future__ import annotations


def add_parser(sub) -> None:
    """``dvasim config``'s arguments, on the subcommand parsers ``sub``."""
    p = sub.add_parser("config", help="every config key: its type, range, default and help (from the schema)")
    p.add_argument("section", nargs="?", default=None,
                   help="one section (model, policy, workload, qos, engine, engine.host, engine.transfer, replay, "
                        "server, sweep, sweep.random, sweep.seeds, sweep.capacity)")
    p.add_argument("--reference", action="store_true", help="the whole reference as Markdown (docs/config.md)")
    p.set_defaults(func=cmd_config)


def sections() -> dict:
    """Every section by name: a run config's, then a sweep file's."""
    from dvasim.config.sections import SCHEMA, SUBSECTIONS
    from dvasim.studies.sweep import SWEEP_SECTIONS

    out = {}
    for name, s in SCHEMA.items():
        out[name] = s
        out.update({k: v for k, v in SUBSECTIONS.items() if k.startswith(name + ".")})
    out.update({s.name: s for s in SWEEP_SECTIONS})
    return out


def reference_text() -> str:
    """``docs/config.md``: the run config's reference, then the sweep file's."""
    from dvasim.config.reference import reference_markdown, section_markdown
    from dvasim.studies.sweep import SWEEP_SECTIONS

    sweep = ["## Sweep files (`dvasim sweep SWEEP.toml`)", "",
             "A sweep file names a base config and the keys to vary; each point runs as `dvasim run` would.", ""]
    sweep += [section_markdown(s, level=3) for s in SWEEP_SECTIONS]
    return reference_markdown() + "\n" + "\n".join(sweep).rstrip() + "\n"


def cmd_config(args) -> int:
    from dvasim.config.reference import section_help
    from dvasim.errors import ConfigError

    known = sections()
    if args.section is not None and args.section not in known:
        raise ConfigError("config", f"unknown section {args.section!r}; allowed: {', '.join(known)}")
    if args.reference:
        if args.section is not None:
            raise ConfigError("config", f"--reference prints the whole reference; give it without a section, or "
                                        f"give the section {args.section!r} without --reference")
        print(reference_text(), end="")
        return 0
    chosen = known.values() if args.section is None else [known[args.section]]
    print("\n".join(section_help(s) for s in chosen), end="")
    return 0
