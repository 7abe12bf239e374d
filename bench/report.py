"""Turning a run's results into the checks, a markdown report and a PNG chart."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

PEERS = ["naive", "opencode-style", "t3-style"]
WARM = "snapshotd warm"
COLD = "snapshotd cold"
CAPTURE_ORDER = ["git status", "naive", "opencode-style", "t3-style", COLD, WARM]
OTHER_ORDER = ["opencode-style", "t3-style", COLD, WARM]


def _median(case: dict[str, Any], method: str) -> float | None:
    entry = case["methods"].get(method)
    if not entry or not entry["ms"].get("n"):
        return None
    return float(entry["ms"]["median"])


def _fmt_ms(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    if value >= 100:
        return f"{value:.0f} ms"
    if value >= 10:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def _fmt_ratio(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "-"
    if value >= 100:
        return f"{value:.0f}x"
    if value >= 10:
        return f"{value:.1f}x"
    return f"{value:.2f}x"


def _procs(case: dict[str, Any], method: str) -> str:
    entry = case["methods"].get(method)
    if not entry or not entry.get("processes"):
        return ""
    lo, hi = entry["processes"]["min"], entry["processes"]["max"]
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _verdict(passed: bool | None) -> str:
    return "n/a (one tree size)" if passed is None else ("pass" if passed else "FAIL")


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / (1024 * 1024):.0f} MiB"


# --------------------------------------------------------------------------- checks


def checks(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's "must show" items, each with its figures and a pass flag."""
    out: dict[str, Any] = {}
    clean = [c for c in results.get("cases", []) if c["case"] == "clean" and c["tree"].startswith("syn-")]
    clean.sort(key=lambda c: c["files"])
    if clean:
        warm = {c["tree"]: _median(c, WARM) for c in clean}
        warm_procs = max(c["methods"][WARM]["processes"]["max"] for c in clean if WARM in c["methods"])
        scans = [c["methods"][WARM].get("scans", {}) for c in clean if WARM in c["methods"]]
        values = [v for v in warm.values() if v]
        spread = max(values) / min(values) if values else None
        out["warm_clean_flat"] = {
            "medians_ms": warm,
            "largest_over_smallest": round(spread, 3) if spread else None,
            "max_processes": warm_procs,
            "scans": scans,
            # One tree size cannot show flatness: no verdict then.
            "pass": (spread is not None and spread <= 1.5 and warm_procs == 0) if len(values) > 1 else None,
        }
        cold_vs_status = {}
        ok = True
        for c in clean:
            status, cold = _median(c, "git status"), _median(c, COLD)
            if status and cold:
                ratio = cold / status
                cold_vs_status[c["tree"]] = {
                    "cold_ms": cold,
                    "git_status_ms": status,
                    "ratio": round(ratio, 3),
                    "cold_processes": c["methods"][COLD]["processes"]["max"],
                }
                ok = ok and ratio <= 1.5 and c["methods"][COLD]["processes"]["max"] <= 2
        out["cold_vs_git_status"] = {"by_tree": cold_vs_status, "pass": ok and bool(cold_vs_status)}
    big = [s for s in results.get("scale", []) if s["sessions"] >= 250]
    if big:
        s = big[-1]
        out["scale_250"] = {
            "sessions": s["sessions"],
            "failures": s["failures"],
            "connect_failures": s.get("connect_failures", 0),
            "started": s["captures_started"],
            "completed": s["captures_completed"],
            "pass": s["failures"] == 0 and s.get("connect_failures", 0) == 0
            and s["captures_started"] == s["captures_completed"],
        }
    if results.get("memory"):
        out["memory_under_200_b_per_file"] = {
            m["label"]: m["bytes_per_file"] for m in results["memory"]
        }
        single = sorted((m for m in results["memory"] if m["worktrees"] == 1), key=lambda m: m["tracked_files"])
        if len(single) >= 2 and single[-1]["tracked_files"] > single[0]["tracked_files"]:
            a, b = single[0], single[-1]
            # The growth from the smaller to the larger tree: the cost of one more file,
            # without the fixed cost of an open worktree (watcher thread, repository handles).
            out["memory_marginal_bytes_per_file"] = round(
                (b["rss_open"] - a["rss_open"]) / (b["tracked_files"] - a["tracked_files"]), 1
            )
    disagree = [f"{c['case']}@{c['tree']}" for c in results.get("cases", []) if c.get("agree") is False]
    out["captures_agree"] = {"disagreements": disagree, "pass": not disagree}
    return out


def slower_than_peers(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every case where a peer's median beat snapshotd warm or cold."""
    found = []
    for case in results.get("cases", []) + results.get("real", {}).get("cases", []):
        peers = {m: _median(case, m) for m in PEERS if _median(case, m) is not None}
        if not peers:
            continue
        best_peer = min(peers, key=lambda m: peers[m])
        for ours in (WARM, COLD):
            mine = _median(case, ours)
            if mine is not None and peers[best_peer] < mine:
                found.append({
                    "case": case["case"],
                    "tree": case["tree"],
                    "snapshotd": ours,
                    "snapshotd_ms": mine,
                    "peer": best_peer,
                    "peer_ms": peers[best_peer],
                    "ratio": round(mine / peers[best_peer], 2),
                })
    return found


# --------------------------------------------------------------------------- markdown


def _case_table(cases: list[dict[str, Any]], order: list[str], title: str) -> list[str]:
    methods = [m for m in order if any(m in c["methods"] for c in cases)]
    lines = [f"### {title}", "", "Median wall time (processes per call).", ""]
    lines.append("| case | tree | " + " | ".join(methods) + " |")
    lines.append("| --- | --- | " + " | ".join("---:" for _ in methods) + " |")
    for c in cases:
        cells = []
        for m in methods:
            if m not in c["methods"]:
                cells.append("")
                continue
            procs = _procs(c, m)
            cells.append(f"{_fmt_ms(_median(c, m))} ({procs})" if procs else _fmt_ms(_median(c, m)))
        lines.append(f"| {c['case']} | {c['tree']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Ratio of each median to snapshotd warm's and cold's (above 1: snapshotd is faster).")
    lines.append("")
    others = [m for m in methods if m not in (WARM,)]
    lines.append("| case | tree | " + " | ".join(f"{m} / warm" for m in others)
                 + " | " + " | ".join(f"{m} / cold" for m in PEERS if m in methods) + " |")
    lines.append("| --- | --- | " + " | ".join("---:" for _ in others)
                 + " | " + " | ".join("---:" for m in PEERS if m in methods) + " |")
    for c in cases:
        warm, cold = _median(c, WARM), _median(c, COLD)
        cells = []
        for m in others:
            v = _median(c, m)
            cells.append(_fmt_ratio(v / warm) if v is not None and warm else "-")
        for m in PEERS:
            if m in methods:
                v = _median(c, m)
                cells.append(_fmt_ratio(v / cold) if v is not None and cold else "-")
        lines.append(f"| {c['case']} | {c['tree']} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def _warm_scans(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["Warm path taken by snapshotd warm (watch = warm path, full = cold path) and p90:", ""]
    lines.append("| case | tree | scans | warm p90 | cold p90 | files hashed (max) |")
    lines.append("| --- | --- | --- | ---: | ---: | ---: |")
    for c in cases:
        warm = c["methods"].get(WARM)
        cold = c["methods"].get(COLD)
        if not warm:
            continue
        scans = ", ".join(f"{k} {v}" for k, v in sorted(warm.get("scans", {}).items())) or "-"
        lines.append(
            f"| {c['case']} | {c['tree']} | {scans} | {_fmt_ms(warm['ms'].get('p90'))} | "
            f"{_fmt_ms(cold['ms'].get('p90')) if cold else '-'} | {warm.get('hashed_max', '-')} |"
        )
    lines.append("")
    return lines


def markdown(results: dict[str, Any]) -> str:
    lines = [f"## Results: {results['name']} ({results['date']})", ""]
    m = results["machine"]
    lines.append(
        f"Machine: {m.get('cpus_usable')} CPUs ({m.get('cpu', '?')}), "
        f"{round(m.get('mem_total_kib', 0) / 1048576)} GiB RAM, {m.get('git')}, Python {m.get('python')}, "
        f"pygit2 {m.get('pygit2')} (libgit2 {m.get('libgit2')}). Run took {results['duration_s'] / 60:.1f} min."
    )
    if results.get("load_average_at_start"):
        lines.append("")
        lines.append(
            f"Load average (1, 5, 15 min) at start {results['load_average_at_start']}, at end "
            f"{results.get('load_average_at_end')}: other work shared the machine when above the CPU count."
        )
    lines.append("")
    trees = results.get("trees", [])
    if trees:
        lines.append("Trees: " + "; ".join(
            f"{t['name']} ({t['files']:,} files, {t['bytes'] / 1e6:.0f} MB)" for t in trees) + ".")
        lines.append("")
    chk = results.get("checks", {})
    if chk:
        lines.append("### Targets")
        lines.append("")
        wf = chk.get("warm_clean_flat")
        if wf:
            vals = ", ".join(f"{k} {_fmt_ms(v)}" for k, v in wf["medians_ms"].items())
            lines.append(
                f"- Warm clean capture flat with tree size: {vals}; largest/smallest "
                f"{wf['largest_over_smallest']}, max processes {wf['max_processes']} → "
                f"**{_verdict(wf['pass'])}**"
            )
        cs = chk.get("cold_vs_git_status")
        if cs:
            vals = ", ".join(
                f"{k} {_fmt_ms(v['cold_ms'])} vs {_fmt_ms(v['git_status_ms'])} ({v['ratio']}x, {v['cold_processes']} proc)"
                for k, v in cs["by_tree"].items()
            )
            lines.append(f"- Cold capture within 1.5 x `git status`: {vals} → **{'pass' if cs['pass'] else 'FAIL'}**")
        sc = chk.get("scale_250")
        if sc:
            lines.append(
                f"- {sc.get('sessions', 250)} sessions (at least 250): {sc['completed']} of {sc['started']} captures "
                f"answered, {sc['failures']} failures, {sc.get('connect_failures', 0)} connect failures "
                f"→ **{'pass' if sc['pass'] else 'FAIL'}**"
            )
        mem = chk.get("memory_under_200_b_per_file")
        if mem:
            vals = ", ".join(f"{k}: {v:.0f} B" for k, v in mem.items())
            lines.append(f"- Resident bytes per tracked file (aim: under 200): {vals}")
        marginal = chk.get("memory_marginal_bytes_per_file")
        if marginal is not None:
            lines.append(f"- Marginal resident bytes per tracked file (growth from the smaller to the larger "
                         f"single worktree): {marginal:.0f} B")
        ag = chk.get("captures_agree")
        if ag:
            lines.append(
                "- Every method's tree id equal in every iteration: "
                + ("**yes**" if ag["pass"] else f"**no**: {', '.join(ag['disagreements'])}")
            )
        lines.append("")
    cases = results.get("cases", [])
    capture_cases = [c for c in cases if c["kind"] == "capture"]
    other_cases = [c for c in cases if c["kind"] != "capture"]
    if capture_cases:
        lines += _case_table(capture_cases, CAPTURE_ORDER, "Capture")
        lines += _warm_scans(capture_cases)
    if other_cases:
        lines += _case_table(other_cases, OTHER_ORDER, "Restore and diff")
        wrong = [
            f"{c['case']}@{c['tree']}: {name} {entry['wrong']}"
            for c in other_cases for name, entry in c["methods"].items() if entry.get("wrong")
        ]
        if wrong:
            lines.append("Paths not as expected after the call (restore: files differing from the checkpoint; "
                         "diff: wrong file count), summed over iterations: " + "; ".join(wrong) + ".")
            lines.append("")
    real = results.get("real", {})
    if real.get("cases"):
        lines += _case_table(real["cases"], CAPTURE_ORDER, f"Real project: {real.get('label', '')}")
        for c in real["cases"]:
            if c.get("turns"):
                turns = ", ".join(f"→{t['to']} ({t['written']} written, {t['removed']} removed)" for t in c["turns"])
                lines.append(f"Turns: {turns}.")
                lines.append("")
    elif real.get("skipped"):
        lines += ["### Real project", "", f"Skipped: {real['skipped']}", ""]
    scale = results.get("scale", [])
    if scale:
        s0 = scale[0]
        lines += [
            "### Many sessions",
            "",
            f"{s0['worktrees']} linked worktrees of {s0['files_per_worktree']:,} files; each session captures before "
            f"and after every turn, think time {s0['think_s'][0]}-{s0['think_s'][1]} s; "
            f"{s0['window_s']:.0f} s window after {s0['warmup_s']:.0f} s warm-up; one daemon.",
            "",
            "| daemon | sessions | connections | captures | per s | p50 | p99 | max | failures | connect failures "
            "| processes / capture | daemon CPU (cores) | daemon peak RSS | ping p50 | ping p99 | watch_miss |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for s in scale:
            lat, ping = s["latency_ms"], s["ping_ms"]
            lines.append(
                f"| {s.get('checkout', 'this')} | {s['sessions']} | {s.get('connections', s['sessions'])} "
                f"| {s['captures_completed']} "
                f"| {s['captures_per_s']} | {_fmt_ms(lat.get('median'))} "
                f"| {_fmt_ms(lat.get('p99'))} | {_fmt_ms(lat.get('max'))} | {s['failures']} "
                f"| {s.get('connect_failures', 0)} | "
                f"{s['processes_per_capture']} | {s['daemon_cpu_cores']} | {_mb(s['daemon_rss_peak_in_window'])} "
                f"| {_fmt_ms(ping.get('median'))} | {_fmt_ms(ping.get('p99'))} | {s['watch_miss']} |"
            )
        lines.append("")
    memory = results.get("memory", [])
    if memory:
        lines += [
            "### Memory",
            "",
            "| open worktrees | tracked files | idle RSS | RSS open | bytes per file | peak bytes per file |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for mm in memory:
            lines.append(
                f"| {mm['label']} | {mm['tracked_files']:,} | {_mb(mm['rss_idle'])} | {_mb(mm['rss_open'])} "
                f"| {mm['bytes_per_file']:.0f} | {mm['peak_bytes_per_file']:.0f} |"
            )
        lines.append("")
    spawn = results.get("spawn")
    if spawn:
        lines += _spawn_tables(spawn)
    slower = results.get("slower_than_peers", [])
    if slower:
        lines += ["### Where a peer was faster", ""]
        for s in slower:
            lines.append(
                f"- {s['case']} on {s['tree']}: {s['snapshotd']} {_fmt_ms(s['snapshotd_ms'])} vs "
                f"{s['peer']} {_fmt_ms(s['peer_ms'])} ({s['ratio']}x)"
            )
        lines.append("")
    return "\n".join(lines)


def _spawn_tables(spawn: dict[str, Any]) -> list[str]:
    lines = ["### Spawning processes", ""]
    latency = spawn.get("latency", {})
    stages = latency.get("stages", [])
    if stages:
        lines.append(
            f"Start and wait for `{' '.join(latency.get('command', []))}`, {latency.get('runs')} runs per way, "
            "ways in turn (from bench/spawn_bench.py): median / p99."
        )
        lines.append("")
        lines.append("| way | " + " | ".join(s["label"] for s in stages) + " |")
        lines.append("| --- | " + " | ".join("---:" for _ in stages) + " |")
        for way in stages[0]["results"]:
            cells = [
                f"{_fmt_ms(s['results'][way]['median_ms'])} / {_fmt_ms(s['results'][way]['p99_ms'])}"
                for s in stages
            ]
            lines.append(f"| {way} | " + " | ".join(cells) + " |")
        lines.append("")
    ping = spawn.get("ping_under_load", {})
    if ping:
        sizes = list(ping)
        lines.append(
            f"Ping round trip of a trio loop that starts `{' '.join(spawn.get('load_argv', []))}` "
            f"{spawn.get('rate_per_s')} times a second with each way (p50 / p99 / max; achieved spawns per second):"
        )
        lines.append("")
        lines.append("| way | " + " | ".join(
            f"{s} process (RSS {_mb(next(iter(ping[s].values()))['child_rss'])})" for s in sizes) + " |")
        lines.append("| --- | " + " | ".join("---:" for _ in sizes) + " |")
        for way in ping[sizes[0]]:
            cells = []
            for s in sizes:
                p = ping[s].get(way)
                cells.append(
                    f"{_fmt_ms(p['median'])} / {_fmt_ms(p['p99'])} / {_fmt_ms(p['max'])}; {p['spawns_per_s']}/s"
                    if p else "-"
                )
            lines.append(f"| {way} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


# --------------------------------------------------------------------------- chart


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in results.get("cases", []) if c["kind"] == "capture"]
    scale = results.get("scale", [])
    panels = 1 + bool(cases) + bool(scale)
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2), dpi=80)
    if panels == 1:
        axes = [axes]
    ax_iter = iter(axes)
    colors = {"git status": "#999999", "naive": "#d62728", "opencode-style": "#ff7f0e",
              "t3-style": "#8c564b", COLD: "#1f77b4", WARM: "#2ca02c"}
    if cases:
        largest = max(c["files"] for c in cases)
        big = [c for c in cases if c["files"] == largest]
        ax = next(ax_iter)
        names = [c["case"] for c in big]
        methods = [m for m in CAPTURE_ORDER if any(m in c["methods"] for c in big)]
        width = 0.8 / len(methods)
        for i, m in enumerate(methods):
            vals = [_median(c, m) or float("nan") for c in big]
            ax.bar([x + i * width for x in range(len(big))], vals, width, label=m, color=colors.get(m))
        ax.set_yscale("log")
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(big))])
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("median ms (log)")
        ax.set_title(f"capture, {big[0]['tree']}", fontsize=10)
        ax.legend(fontsize=7)
    clean = sorted((c for c in cases if c["case"] == "clean" and c["tree"].startswith("syn-")),
                   key=lambda c: c["files"])
    ax = next(ax_iter)
    if clean:
        xs = [c["files"] for c in clean]
        for m in ("git status", "naive", "opencode-style", "t3-style", COLD, WARM):
            ys = [_median(c, m) for c in clean]
            if any(y is not None for y in ys):
                ax.plot(xs, [y if y is not None else float("nan") for y in ys], marker="o", label=m,
                        color=colors.get(m))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tracked files")
        ax.set_ylabel("median ms (log)")
        ax.set_title("clean capture vs tree size", fontsize=10)
        ax.legend(fontsize=7)
    if scale:
        ax = next(ax_iter)
        xs = [s["sessions"] for s in scale]
        ax.plot(xs, [s["latency_ms"].get("median") for s in scale], marker="o", label="capture p50")
        ax.plot(xs, [s["latency_ms"].get("p99") for s in scale], marker="o", label="capture p99")
        ax.plot(xs, [s["ping_ms"].get("p99") for s in scale], marker="s", label="ping p99")
        ax.set_xlabel("concurrent sessions")
        ax.set_ylabel("ms")
        ax.set_title("many sessions (warm daemon)", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
