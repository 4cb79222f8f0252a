"""The one palette of every dvasim figure: the command line's (:mod:`dvasim.reporting.plots`), the timeline's, the
experiments' scripts (``experiments/common.py`` re-exports these) and the notebooks.

* :data:`PALETTE`: one colour per policy label; :func:`policy_colours` gives seaborn's ``palette=``,
  :func:`policy_colour` one label's colour (a script's spellings such as ``dvabatch+window``, ``N-Ebird``,
  ``LazyB`` or ``GraphB(50)`` mapped to the policy they name);
* :data:`SHARE_COLOURS`: the steps of DVABatch's attribution, each distinct from the others and from the
  policies' colours ("rest" is grey, not DVABatch's red);
* :data:`STRATEGY_COLOURS`: the characterization study's strategies I..VIII (its Table 5), one colour each;
* :data:`VERDICT_STYLE`: how a sweep, capacity or latency figure marks a point whose run was not stable
  (:data:`dvasim.reporting.verdict.VERDICTS`): a hollow marker of its own shape and colour around the point.

Nothing here imports matplotlib.
"""

from __future__ import annotations

import re

# One colour per policy label in every figure: the paper's three systems first, then Triton with two instances (a
# lighter shade of its base), DVABatch behind DelayBatch's window, and DVABatch's cumulative ablations (greens,
# darker = more of DVABatch).
PALETTE: dict[str, str] = {
    "zerobatch": "#4c72b0",
    "delaybatch": "#dd8452",
    "dvabatch": "#c44e52",
    "zerobatch-x2": "#a1c1e6",
    "delaybatch-x2": "#f4c29a",
    "dvabatch-window": "#8c4a9e",
    "dvabatch-built": "#7a1f22",  # DVABatch as its authors built it: a darker DVABatch red
    "dva-multientry": "#c7e9c0",
    "dva+stretch": "#74c476",
    "dva+split": "#31a354",
    "dva+input": "#006d2c",
    # the papers' peer systems
    "serial": "#8c8c8c",
    "graphbatch": "#937860",
    "lazybatch": "#64b5cd",
    "tfserving-nowait": "#ccb974",
    "tfserving-optwait": "#b8860b",
    "tfserving-static": "#7f6a00",
    "n-ebird": "#da8bc3",
    "e-ebird": "#a0317f",
    # LazyBatching's ideal batcher (its paper's Oracle)
    "oracle": "#3b3b3b",
}
EXTRA = ("#937860", "#8c8c8c", "#ccb974", "#64b5cd", "#da8bc3")  # labels the palette does not know, in turn

# the scripts' spellings of the policies (lower case, before any "(...)")
ALIASES = {"dvabatch+window": "dvabatch-window", "dvabatch_window": "dvabatch-window", "no_wait": "tfserving-nowait",
           "opt_wait": "tfserving-optwait", "static": "tfserving-static", "lazyb": "lazybatch",
           "graphb": "graphbatch"}

# short names of the attribution's steps, for tables and legends
SHARE_NAMES = {"share_multientry_pp": "multi-entry", "share_stretch_pp": "stretch", "share_split_pp": "split",
               "share_input_pp": "input clust.", "share_rest_pp": "rest"}
# the attribution's steps: four distinct hues (a tiny share stays visible: every segment has a dark edge) and a
# neutral grey for what no step explains -- never DVABatch's red, which would read as DVABatch itself
SHARE_COLOURS = {"share_multientry_pp": "#a6d854", "share_stretch_pp": "#1b9e77", "share_split_pp": "#386cb0",
                 "share_input_pp": "#e7298a", "share_rest_pp": "#bdbdbd"}

# the characterization study's reorchestrating strategies (its Table 5's rows I..VIII: stretch, split, pipeline on or
# off), one colour each in every figure that draws them (table5_strategies, study_fig10 / fig12): naive batching (I)
# grey, everything on (VIII, DVABatch) DVABatch's red, the others distinct hues apart from the verdicts' colours
STRATEGY_COLOURS = {"I": "#7f7f7f", "II": "#17becf", "III": "#bcbd22", "IV": "#8c564b", "V": "#e377c2",
                    "VI": "#2ca02c", "VII": "#1f4e79", "VIII": "#c44e52"}

# the verdicts a figure marks (every one but "stable"), least to most severe: a hollow marker around the point
VERDICT_STYLE: dict[str, dict] = {
    "over-SLO": {"marker": "o", "color": "#ff7f00", "s": 110},
    "rejecting": {"marker": "s", "color": "#984ea3", "s": 120},
    "metastable": {"marker": "D", "color": "#377eb8", "s": 110},
    "unstable": {"marker": "X", "color": "#e41a1c", "s": 150},
}


def policy_key(label) -> str:
    """The :data:`PALETTE` key a label names: itself when known, else its lower-case spelling without a
    ``(...)`` part, through :data:`ALIASES` (``"GraphB(50)"`` -> ``graphbatch``, ``"N-Ebird"`` -> ``n-ebird``)."""
    name = str(label)
    if name in PALETTE:
        return name
    low = re.sub(r"\s*\(.*\)$", "", name).strip().lower()
    return ALIASES.get(low, low)


def policy_colour(label, default: str = "#7f7f7f") -> str:
    """One label's colour: its policy's (:func:`policy_key`), else ``default``."""
    return PALETTE.get(policy_key(label), default)


def policy_order(labels) -> list[str]:
    """``labels`` in :data:`PALETTE` order, unknown ones after them (sorted)."""
    present = set(labels)
    return [p for p in PALETTE if p in present] + sorted(present - set(PALETTE))


def policy_colours(labels) -> dict[str, str]:
    """A colour for every label, for seaborn's ``palette=``: :data:`PALETTE`'s (a script's spelling of a policy
    too: :func:`policy_key`), and a fixed cycle for labels it does not know."""
    extra = iter(EXTRA * 4)
    out = {}
    for p in policy_order(labels):
        key = policy_key(p)
        out[p] = PALETTE[key] if key in PALETTE else next(extra)
    return out


def label_palette(labels) -> tuple[list[str], dict[str, str] | None]:
    """The sweep labels in order and their colours: when every label names a different policy first (its first
    word), that policy's colour (labels then in :data:`PALETTE` order); else ``None`` (seaborn's own)."""
    labels = list(dict.fromkeys(labels))
    heads = [lb.split(" ", 1)[0] for lb in labels]
    if len(set(heads)) != len(heads) or not all(h in PALETTE for h in heads):
        return labels, None
    order = list(PALETTE)
    return sorted(labels, key=lambda lb: order.index(lb.split(" ", 1)[0])), {lb: PALETTE[h] for lb, h in
                                                                              zip(labels, heads)}
