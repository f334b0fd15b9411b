"""Draws docs/how_it_works.png, the README's picture of one decoding step.

    python docs/draw_how_it_works.py        # needs matplotlib (pip install ".[plot]")

Prompt and outputs feed the trie; the trie drafts a tree of likely continuations; the target
model verifies the whole tree in one forward pass with a tree attention mask; the longest path
that matches the model's own choices is accepted, plus one bonus token; the new tokens go back
into the trie.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).with_name("how_it_works.png")


def box(ax, x, y, w, h, title, lines, color):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                fc=color, ec="#333333", lw=1.2))  # fmt: skip
    ax.text(x + w / 2, y + h - 0.16, title, ha="center", va="top", fontsize=11, weight="bold")
    for i, line in enumerate(lines):
        ax.text(x + w / 2, y + h - 0.52 - 0.27 * i, line, ha="center", va="top", fontsize=8.5)


def arrow(ax, a, b, text="", curve=0.0):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=14, lw=1.3,
                                 color="#333333", connectionstyle=f"arc3,rad={curve}"))  # fmt: skip
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.12, text, ha="center", fontsize=8,
                style="italic")  # fmt: skip


def tree(ax, x0, y0):
    """A small draft tree: root (last verified token) and two branches."""
    nodes = {0: (0, 0), 1: (0.55, 0.35), 2: (1.1, 0.35), 3: (1.65, 0.35), 4: (0.55, -0.35),
             5: (1.1, -0.35)}  # fmt: skip
    labels = {0: "the", 1: "cat", 2: "sat", 3: "on", 4: "dog", 5: "ran"}
    accepted = {0, 1, 2}
    for child, parent in [(1, 0), (2, 1), (3, 2), (4, 0), (5, 4)]:
        (ax_, ay), (bx, by) = nodes[parent], nodes[child]
        ax.plot([x0 + ax_, x0 + bx], [y0 + ay, y0 + by], color="#555555", lw=1, zorder=1)
    for n, (dx, dy) in nodes.items():
        fc = "#7fc97f" if n in accepted else "#dddddd"
        ax.add_patch(FancyBboxPatch((x0 + dx - 0.22, y0 + dy - 0.11), 0.44, 0.22,
                                    boxstyle="round,pad=0.01", fc=fc, ec="#333333", lw=0.8,
                                    zorder=2))  # fmt: skip
        ax.text(x0 + dx, y0 + dy, labels[n], ha="center", va="center", fontsize=7.5, zorder=3)


def main() -> int:
    fig, ax = plt.subplots(figsize=(12, 4.2), dpi=130)
    ax.set_xlim(0, 12)
    ax.set_ylim(-0.1, 4.2)
    ax.axis("off")
    box(ax, 0.2, 1.3, 2.2, 1.9, "context", ["the request's prompt", "+ its verified tokens",
        "(and, per namespace,", "earlier requests' outputs)"], "#fdf6e3")  # fmt: skip
    box(ax, 3.0, 1.3, 2.2, 1.9, "n-gram trie", ["Rust, arena of nodes", "counts of every",
        "n-gram up to depth 12", "bounded memory"], "#e8f1fb")  # fmt: skip
    box(ax, 5.8, 1.0, 2.6, 2.6, "draft tree", ["best-first by frequency", "", "", "", "",
        "", "tokens + parents"], "#f3e8fb")  # fmt: skip
    tree(ax, 6.25, 2.05)
    box(ax, 9.0, 1.3, 2.8, 1.9, "one verify forward", ["target model, tree mask:", "each node sees its",
        "ancestors only", "-> longest matching path", "+ 1 bonus token"], "#e9f7e9")  # fmt: skip
    arrow(ax, (2.4, 2.25), (3.0, 2.25), "index")
    arrow(ax, (5.2, 2.25), (5.8, 2.25), "draft")
    arrow(ax, (8.4, 2.25), (9.0, 2.25), "verify")
    arrow(ax, (10.4, 1.3), (1.3, 1.3), curve=-0.18)
    ax.text(5.85, 0.28, "accepted path + bonus token: exactly what plain decoding gives, "
            "fed back into the trie", ha="center", fontsize=9, style="italic")  # fmt: skip
    ax.text(6.0, 4.0, "lookahead: one decoding step", ha="center", fontsize=13, weight="bold")
    fig.savefig(OUT, bbox_inches="tight")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
