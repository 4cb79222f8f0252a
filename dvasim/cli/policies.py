"""``dvasim policies [NAME] [--json]``: every batching policy a config can name, its aliases and its parameters
(help and default); with NAME, that policy's whole reference."""

from __future__ import annotations


def add_parser(sub) -> None:
    """``dvasim policies``' arguments, on the subcommand parsers ``sub``."""
    p = sub.add_parser("policies", help="every batching policy a config can name, with its parameters")
    p.add_argument("name", nargs="?", default=None, help="one policy (or alias): its whole reference")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(func=cmd_policies)


def cmd_policies(args) -> int:
    """``dvasim policies [NAME]``: the registered policies, their aliases and parameters (help and default)."""
    import json
    import textwrap

    from dvasim.errors import ConfigError
    from dvasim.policies.base import canonical_name, policy_names, policy_reference

    if args.name is not None and canonical_name(args.name) not in policy_names():
        raise ConfigError("policy", f"unknown policy {args.name!r}; allowed: {', '.join(policy_names())}")
    names = policy_names() if args.name is None else [canonical_name(args.name)]
    refs = [policy_reference(n) for n in names]
    if args.json:
        print(json.dumps(refs, indent=1, default=str))
        return 0
    for ref in refs:
        alias = f" (also: {', '.join(ref['aliases'])})" if ref["aliases"] else ""
        print(f"{ref['name']}{alias}")
        summary = ref["summary"] if args.name is not None else ref["summary"].split(". ")[0].rstrip(".") + "."
        print(textwrap.fill(summary, 116, initial_indent="    ", subsequent_indent="    "))
        for key, p in ref["params"].items():
            default = "" if p["default"] is None else f" [{p['default']}]"
            print(textwrap.fill(f"{key}{default}: {p['help']}", 116, initial_indent="      ",
                                subsequent_indent="        "))
    return 0
