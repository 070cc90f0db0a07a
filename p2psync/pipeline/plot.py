"""The fan-out plot: origin load against the number of participating providers, per strategy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from p2psync.pipeline.strategies import STRATEGIES, relay_k

_STYLE = {"direct": ("tab:red", "o"), "relay": ("tab:blue", "s"), "subscribe": ("tab:green", "^")}


def plot_origin_load(by_providers: list[dict[str, Any]], path: str | Path) -> Path:
    """Write a PNG: the mean origin load of the batch's messages per provider count, with the
    relay strategy's bounds (k when the origin is not a coordinator; k - 1 + ceil((P - k)/k) + 1
    when it is) for reference."""
    import matplotlib  # the [pipeline] extra; loaded only when a plot is drawn

    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    xs = [int(entry["providers"]) for entry in by_providers]
    for strategy in STRATEGIES:
        points = [(int(e["providers"]), float(e[strategy]["originLoad"])) for e in by_providers if strategy in e]
        if points:
            color, marker = _STYLE[strategy]
            ax.plot([p for p, _ in points], [v for _, v in points], marker=marker, color=color, label=strategy)
    top = max([*xs, 2])
    model = list(range(2, top + 1))
    if model:
        low = [relay_k(p) for p in model]
        high = [relay_k(p) - 1 + -(-(p - relay_k(p)) // relay_k(p)) + (1 if p > relay_k(p) else 0) for p in model]
        ax.fill_between(model, low, high, color="tab:blue", alpha=0.12, label="relay bounds")
    ax.set_xlabel("participating providers (P)")
    ax.set_ylabel("messages sent by the origin provider")
    ax.set_title("Origin load per message by delivery strategy")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, format="png")
    plt.close(fig)
    return out
