"""The results: a table on stdout, a JSON file, and a PNG chart (matplotlib, Agg backend)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLUMNS = (
    ("store", "<", "{}"),
    ("scenario", "<", "{}"),
    ("req/s", ">", "{:,.0f}"),
    ("p50 ms", ">", "{:.2f}"),
    ("p99 ms", ">", "{:.2f}"),
    ("bare req/s", ">", "{:,.0f}"),
    ("bare p50", ">", "{:.2f}"),
    ("bare p99", ">", "{:.2f}"),
    ("ratio", ">", "{:.2f}"),
    ("target", ">", "{}"),
    ("srv us/req", ">", "{:.0f}"),
    ("db us/req", ">", "{}"),
    ("checks", "<", "{}"),
)


def _row(s: dict[str, Any]) -> list[str]:
    rx, bare = s["receiver"], s["bare"]
    target = s.get("target")
    checks = "FAIL" if s["checks"]["failures"] else ("ok*" if s["checks"]["warnings"] else "ok")
    values = [
        s["store"],
        s["name"],
        rx["rps"],
        rx["p50_ms"],
        rx["p99_ms"],
        bare["rps"],
        bare["p50_ms"],
        bare["p99_ms"],
        s["ratio"],
        "-" if target is None else f">={target:.2f}",
        s["cpu"]["server_us_per_req"],
        f"{s['cpu']['db_us_per_req']:.0f}" if s["store"] == "postgresql" else "-",
        checks,
    ]
    return [fmt.format(v) for (_, _, fmt), v in zip(COLUMNS, values, strict=True)]


def table(scenarios: list[dict[str, Any]]) -> str:
    rows = [[c[0] for c in COLUMNS], *(_row(s) for s in scenarios)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            cell.ljust(w) if align == "<" else cell.rjust(w)
            for cell, w, (_, align, _) in zip(row, widths, COLUMNS, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def against_hand(scenarios: list[dict[str, Any]]) -> str:
    """The receiver against the hand-written receivers measured in the same run."""
    lines = []
    for s in scenarios:
        for kind, ref in s.get("references", {}).items():
            vs = s["vs_hand"].get(kind, 0)
            lines.append(
                f"| {s['store']} | {s['name']} | {kind} | {ref['rps']:,.0f} | {ref['ratio']:.2f} "
                f"| {s['receiver']['rps']:,.0f} | {s['ratio']:.2f} | {vs:.2f}x |"
            )
    if not lines:
        return ""
    head = (
        "| store | scenario | hand-written | its req/s | its ratio | receiver req/s | "
        "receiver ratio | receiver vs hand |\n|---|---|---|---|---|---|---|---|"
    )
    return head + "\n" + "\n".join(lines)


def per_statement(scenarios: list[dict[str, Any]]) -> str:
    """What each statement cost PostgreSQL per answered request (pg_stat_statements)."""
    lines = []
    for s in scenarios:
        for name, f in (s.get("statements_per_request") or {}).items():
            lines.append(
                f"| {s['name']} | {name} | {f['calls']:.2f} | {f['exec_us']:,.1f} "
                f"| {f['wal_bytes']:,.0f} | {f['blocks']:.1f} |"
            )
    if not lines:
        return ""
    head = (
        "| scenario | statement | calls | exec us | WAL bytes | buffers |\n"
        "|---|---|---|---|---|---|"
    )
    return head + "\n" + "\n".join(lines)


def markdown(scenarios: list[dict[str, Any]]) -> str:
    """The same table in Markdown, for benchmarks/README.md and the docs."""
    header = [c[0] for c in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_row(s)) + " |" for s in scenarios]
    return "\n".join(lines)


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")


def chart(path: Path, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = result["scenarios"]
    names = list(dict.fromkeys(s["name"] for s in scenarios))
    stores = list(dict.fromkeys(s["store"] for s in scenarios))
    by = {(s["name"], s["store"]): s for s in scenarios}
    soak = result.get("soak")
    panels = 3 if soak else 2
    fig, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 5.2), squeeze=False)
    width = 0.8 / max(1, len(stores))
    colors = {"postgresql": "#336791", "sqlite": "#7fa650"}
    xs = range(len(names))

    ax = axes[0][0]
    for i, store in enumerate(stores):
        offsets = [x - 0.4 + width * (i + 0.5) for x in xs]
        values = [by[(n, store)]["ratio"] if (n, store) in by else 0 for n in names]
        bars = ax.bar(offsets, values, width, label=store, color=colors.get(store))
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
        for x, n in zip(offsets, names, strict=True):
            target = by.get((n, store), {}).get("target")
            if target:
                ax.plot([x - width / 2, x + width / 2], [target, target], color="red", lw=2)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("req/s relative to the bare Starlette endpoint")
    ax.set_title("Receiver / bare endpoint (red: target)", fontsize=10)
    ax.legend(fontsize=8)

    ax = axes[0][1]
    for i, store in enumerate(stores):
        offsets = [x - 0.4 + width * (i + 0.5) for x in xs]
        values = [by[(n, store)]["receiver"]["rps"] if (n, store) in by else 0 for n in names]
        ax.bar(offsets, values, width, label=f"receiver, {store}", color=colors.get(store))
        bare = [by[(n, store)]["bare"]["rps"] if (n, store) in by else 0 for n in names]
        ax.scatter(offsets, bare, marker="_", s=200, color="black", zorder=3)
    ax.scatter([], [], marker="_", s=200, color="black", label="bare endpoint, same rounds")
    ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("requests per second")
    ax.set_title("Throughput (64 connections, 1 KiB bodies)", fontsize=10)
    ax.legend(fontsize=8)

    if soak:
        ax = axes[0][2]
        t = [p[0] / 60 for p in soak["rss_samples"]]
        mib = [p[1] / 1024 for p in soak["rss_samples"]]
        ax.plot(t, mib, color="#336791")
        ax.set_xlabel("minutes")
        ax.set_ylabel("server RSS (MiB)")
        ax.set_ylim(bottom=0)
        ax.set_title(
            f"Soak: {soak['store']}, {soak['description']}; peak {soak['peak_rss_mib']:.0f} MiB",
            fontsize=10,
        )
        twin = ax.twinx()
        twin.plot(
            [c["end_s"] / 60 for c in soak["chunks"]],
            [c["rps"] for c in soak["chunks"]],
            "o--",
            color="grey",
            ms=3,
        )
        twin.set_ylabel("req/s per chunk", color="grey")
        twin.set_ylim(bottom=0)

    meta = result["meta"]
    fig.suptitle(
        f"receiver {meta['commit']}{' (dirty)' if meta.get('dirty') else ''} - {meta['machine']}, "
        f"uvicorn {meta['uvicorn_workers_default']} worker, {meta['date']}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
