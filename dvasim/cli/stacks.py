"""``dvasim stacks [NAME] [--json]``: every serving stack a run can name (``--stack``, ``[server] stack``); with
NAME, every parameter of that stack with its value, its meaning and its provenance."""

from __future__ import annotations

from dvasim.cli.common import fmt


def add_parser(sub) -> None:
    """``dvasim stacks``' arguments, on the subcommand parsers ``sub``."""
    p = sub.add_parser("stacks", help="every serving stack a run can name (--stack), with its numbers and their "
                                      "provenance")
    p.add_argument("name", nargs="?", default=None, help="one stack: every parameter, its value and its source")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(func=cmd_stacks)


def cmd_stacks(args) -> int:
    """``dvasim stacks [NAME]``: the serving stacks a run can name (``--stack``, ``[server] stack``); for one
    stack every parameter with its value, its meaning and its provenance."""
    import json
    import textwrap

    from dvasim.server.resolve import stack_by_name
    from dvasim.server.stacks import FIELD_HELP, STACKS

    if args.name is not None:
        stack_by_name(args.name, "stacks")
    names = list(STACKS) if args.name is None else [args.name]
    refs = [stack_reference(STACKS[n]) for n in names]
    if args.json:
        print(json.dumps(refs, indent=1, default=str))
        return 0
    width = max(len(n) for n in STACKS)
    for ref in refs:
        if args.name is None:
            first = ref["summary"].split(". ")[0].rstrip(".")
            print(textwrap.fill(f"{ref['name']:<{width}}  {first}", 116, subsequent_indent=" " * (width + 2)))
            continue
        print(ref["name"])
        print(textwrap.fill(ref["summary"], 116, initial_indent="    ", subsequent_indent="    "))
        if not ref["parameters"]:
            print(f"    adds no host cost: {ref['sources'].get('all', '')}")
            continue
        for key, p in ref["parameters"].items():
            print(textwrap.fill(f"{key} = {fmt(p['value'])}: {FIELD_HELP.get(key, '')}", 116, initial_indent="  ",
                                subsequent_indent="      "))
            print(textwrap.fill(f"source: {p['source']}", 116, initial_indent="      ", subsequent_indent="        "))
    if args.name is None:
        print("\n`dvasim stacks NAME` prints a stack's every number with its provenance; a run names one with "
              "--stack NAME or [server] stack = NAME.")
    return 0


def stack_reference(stack) -> dict:
    """One stack as ``dvasim stacks`` shows it: name, summary, and (unless it adds nothing) every parameter
    with its value (``"inf"`` for an unlimited bandwidth) and provenance (``ServingStack.sources``; ``not given``
    where the stack names none)."""
    import math

    params = {} if stack.adds_nothing else {
        k: {"value": "inf" if isinstance(v, float) and math.isinf(v) else v,
            "source": stack.sources.get(k, "not given")} for k, v in stack.parameters().items()}
    return {"name": stack.name, "summary": stack.summary, "adds_nothing": stack.adds_nothing,
            "parameters": params, "sources": dict(stack.sources)}
