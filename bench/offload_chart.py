"""The offload sweep's PNG: tokens/s per placement (prefill and decode medians per batch size, min-max as
error bars) above, memory per device below. matplotlib is optional (the `bench` extra): without it nothing is
drawn and chart() says so."""
from __future__ import annotations

GIB = 1 << 30
SIZE_PX = (1200, 800)
DPI = 100


def placement_label(row: dict) -> str:
    label = "CPU only" if row["gpu_layers"] == 0 and not row["output_on_gpu"] else f"ngl {row['n_gpu_layers']}"
    return label + (" KV RAM" if row["kv"] == "ram" and label != "CPU only" else "")


def _placements(rows: list[dict]) -> list[str]:
    """Placement labels in sweep order, each once."""
    return list(dict.fromkeys(placement_label(r) for r in rows))


def _bars(ax, labels: list[str], series: list[tuple], spreads: list | None = None) -> None:
    """Grouped bars: one group per label, one bar per series (name, values); spreads[j] = (lows, highs)
    draws the min-max of series j as an error bar."""
    width = 0.8 / max(len(series), 1)
    for j, (name, values) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(labels))]
        err = None
        if spreads is not None:
            lows, highs = spreads[j]
            err = [[max(v - lo, 0) for v, lo in zip(values, lows)], [max(hi - v, 0) for v, hi in zip(values, highs)]]
        ax.bar(xs, values, width, label=name, yerr=err, capsize=2 if err else 0)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def chart(rows: list[dict], path: str, title: str = "") -> str | None:
    """Writes the PNG (SIZE_PX pixels) and returns its path; None (with a message) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only: no display, no GUI toolkit
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed, so no chart was drawn (pip install 'ramlm[bench]'); "
              "the JSON holds every figure")
        return None
    labels = _placements(rows)
    by = {(placement_label(r), r["batch"]): r for r in rows}
    batches = sorted({r["batch"] for r in rows})
    def figure(key: str, b: int) -> list[float]:
        return [by[(p, b)][key] if (p, b) in by else float("nan") for p in labels]
    speed = [(f"{kind} batch {b} (median)", figure(f"{kind}_tok_s", b)) for kind in ("prefill", "decode")
             for b in batches]
    spreads = [(figure(f"{kind}_tok_s_min", b), figure(f"{kind}_tok_s_max", b)) for kind in ("prefill", "decode")
               for b in batches]
    # Planned bytes do not depend on the batch; the measured peak does, so take the largest.
    memory = [("RAM (planned)", [max(r["ram_planned_bytes"] for r in rows if placement_label(r) == p) / GIB
                                 for p in labels]),
              ("GPU (planned)", [max(r["gpu_planned_bytes"] for r in rows if placement_label(r) == p) / GIB
                                 for p in labels]),
              ("GPU (measured peak)", [max(r["gpu_peak_bytes"] for r in rows if placement_label(r) == p) / GIB
                                       for p in labels])]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(SIZE_PX[0] / DPI, SIZE_PX[1] / DPI), dpi=DPI)
    _bars(top, labels, speed, spreads)
    top.set_yscale("log")  # prefill runs tens of times faster than decode
    top.set_ylabel("tokens/s")
    if title:
        top.set_title(title)
    _bars(bottom, labels, memory)
    bottom.set_ylabel("GiB")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
