"""The benchmark's one entry point: ``python -m bench`` (or ``python bench/run.py``).

``--quick`` runs the 5,000-file tree with few iterations, a short real-project
series and short many-session windows (a few minutes on 2 CPUs). Without it,
the full run covers 5k, 50k and 200k files (trees built once under
bench/work/ and reused). Results go to ``bench/results/<date>-<name>.json``,
``.md`` and ``.png``; ``--readme`` also puts the markdown into bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"

import trio

from bench import cases as cases_mod, memory, report, scale, spawn_load, trees
from bench.common import BENCH_DIR, RESULTS, WORK, human_count, machine_info
from bench.methods import Method
from bench.ours import SnapshotdCold, SnapshotdWarm, running_daemon
from bench.peers import GitStatus, NaiveShadow, OpenCodeStyle, T3Style

README_START = "<!-- results:start -->"
README_END = "<!-- results:end -->"
PHASES = ("cases", "real", "memory", "scale", "spawn")
DJANGO_VERSIONS = ["5.0", "5.0.1", "5.0.2", "5.0.3", "5.0.4", "5.0.5", "5.0.6"]

_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", flush=True)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        config = {
            "sizes": [5000],
            "iterations": {5000: 3},
            "real_versions": DJANGO_VERSIONS[:3],
            "real_iterations": 2,
            "scale_worktrees": 10,
            "scale_files": 1000,
            "scale_levels": [1, 50, 250],
            "scale_window_s": 5.0,
            "scale_warmup_s": 3.0,
        }
    else:
        config = {
            "sizes": [5000, 50000, 200000],
            "iterations": {5000: 11, 50000: 7, 200000: 5},
            "real_versions": DJANGO_VERSIONS,
            "real_iterations": 7,
            "scale_worktrees": 25,
            "scale_files": 5000,
            "scale_levels": [1, 50, 250],
            "scale_window_s": 60.0,
            "scale_warmup_s": 10.0,
        }
    if args.sizes:
        config["sizes"] = [int(s) for s in args.sizes.split(",")]
    if args.iterations:
        config["iterations"] = {s: args.iterations for s in config["sizes"]}
    for size in config["sizes"]:
        config["iterations"].setdefault(size, 5)
    if args.sessions:
        config["scale_levels"] = [int(s) for s in args.sessions.split(",")]
    if args.window:
        config["scale_window_s"] = args.window
    if args.worktrees:
        config["scale_worktrees"] = args.worktrees
    if args.scale_files:
        config["scale_files"] = args.scale_files
    if args.think:
        low, _, high = args.think.partition(",")
        config["scale_think_s"] = [float(low), float(high or low)]
    config["scale_checkouts"] = [*args.old, None] if args.old else None
    config["scale_profile"] = args.profile
    config["scale_profile_gil"] = args.profile_gil
    config["scale_pool"] = args.pool
    config["real_project"] = args.real_project
    if args.real_versions:
        config["real_versions"] = args.real_versions.split(",")
    config["cases"] = args.cases.split(",") if args.cases else None
    return config


def _engine_version() -> dict[str, Any]:
    """The commit the measured engine was built from, and whether snapshotd/ had local changes."""
    from bench.common import REPO_ROOT, git

    try:
        head = git(REPO_ROOT, "rev-parse", "HEAD").decode().strip()
        dirty = bool(git(REPO_ROOT, "status", "--porcelain", "--", "snapshotd").strip())
        diff = git(REPO_ROOT, "diff", "HEAD", "--", "snapshotd")
    except RuntimeError:
        return {}
    return {"commit": head, "local_changes": dirty, "diff_sha1": hashlib.sha1(diff).hexdigest() if dirty else None}


def _tree_info(tree: trees.Tree) -> dict[str, Any]:
    return {"name": tree.name, "files": tree.files, "bytes": tree.bytes, "kind": tree.kind}


async def _run_cases(config: dict[str, Any], results: dict[str, Any], synthetic: list[trees.Tree],
                     real: tuple[trees.Tree, list[Path]] | None, phases: set[str]) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="peers-", dir=WORK))
    async with running_daemon("cases") as daemon:
        cold = SnapshotdCold()
        methods: list[Method] = [
            GitStatus(), NaiveShadow(scratch), OpenCodeStyle(scratch), T3Style(), cold, SnapshotdWarm(daemon),
        ]
        try:
            if "cases" in phases:
                wanted = config["cases"]
                for tree in synthetic:
                    runner = cases_mod.CaseRunner(tree, methods, config["iterations"][tree.files], daemon, log)
                    for case in cases_mod.CAPTURE_CASES + cases_mod.OTHER_CASES:
                        if wanted and case.name not in wanted:
                            continue
                        log(f"  {tree.name}: {case.name} ...")
                        started = time.monotonic()
                        before = await _cold_reasons(daemon)
                        result = await runner.run_case(case)
                        result["daemon_cold_reasons"] = _delta(before, await _cold_reasons(daemon))
                        result["seconds"] = round(time.monotonic() - started, 1)
                        results["cases"].append(result)
                        _log_case(result)
                    await cases_mod.finish_tree(tree, methods)
            if real is not None:
                tree, releases = real
                runner = cases_mod.CaseRunner(tree, methods, config["real_iterations"], daemon, log)
                out = []
                for case in cases_mod.REAL_CASES:
                    log(f"  {tree.name}: {case.name} ...")
                    if case.name == "release-turn":
                        result = await runner.release_turns(case, releases)
                    else:
                        result = await runner.run_case(case)
                    out.append(result)
                    _log_case(result)
                await cases_mod.finish_tree(tree, methods)
                results["real"]["cases"] = out
        finally:
            await cold.aclose()
            shutil.rmtree(scratch, ignore_errors=True)


async def _cold_reasons(daemon: Any) -> dict[str, int]:
    counters = (await daemon.call("status"))["counters"]
    return {k.removeprefix("cold_reasons."): v for k, v in counters.items() if k.startswith("cold_reasons.")}


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def _log_case(result: dict[str, Any]) -> None:
    parts = []
    for name, entry in result["methods"].items():
        if entry["ms"].get("n"):
            parts.append(f"{name} {entry['ms']['median']:.1f}ms/{entry['processes'].get('max', '?')}p")
    agree = "" if result.get("agree", True) else "  TREES DISAGREE"
    log("    " + ", ".join(parts) + agree)
    if result.get("daemon_cold_reasons"):
        log(f"    daemon cold paths: {result['daemon_cold_reasons']}")


async def _main_async(config: dict[str, Any], results: dict[str, Any], phases: set[str],
                      synthetic: list[trees.Tree], real: tuple[trees.Tree, list[Path]] | None,
                      linked: list[trees.Tree]) -> None:
    if phases & {"cases", "real"}:
        log("cases: every method, interleaved")
        await _run_cases(config, results, synthetic, real if "real" in phases else None, phases)
    if "memory" in phases:
        log("memory")
        configs: list[tuple[str, list[trees.Tree]]] = [
            (f"1 worktree of {human_count(linked[0].files)} files", linked[:1]),
            (f"10 worktrees of {human_count(linked[0].files)} files", linked[:10]),
        ]
        if synthetic and synthetic[-1].files > linked[0].files:
            configs.append((f"1 worktree of {human_count(synthetic[-1].files)} files", [synthetic[-1]]))
        results["memory"] = await memory.run(configs, log)
    if "scale" in phases:
        log("scale")
        results["scale"] = await scale.run(
            linked,
            config["scale_levels"],
            window_s=config["scale_window_s"],
            warmup_s=config["scale_warmup_s"],
            pool=config["scale_pool"],
            think=tuple(config.get("scale_think_s", (1.0, 2.0))),
            checkouts=config["scale_checkouts"],
            profile=config["scale_profile"],
            profile_gil=config["scale_profile_gil"],
            log=log,
        )


def _write(results: dict[str, Any], update_readme: bool) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"{results['date']}-{results['name']}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    text = report.markdown(results)
    stem.with_suffix(".md").write_text(text + "\n")
    try:
        report.chart(results, stem.with_suffix(".png"))
    except Exception as exc:  # a chart is nice to have; the figures are in the JSON
        log(f"chart not written: {exc}")
    if update_readme:
        readme = BENCH_DIR / "README.md"
        body = readme.read_text()
        if README_START in body and README_END in body:
            head, rest = body.split(README_START, 1)
            _, tail = rest.split(README_END, 1)
            image = f"![chart](results/{stem.name}.png)\n\n"
            body = f"{head}{README_START}\n{image}{text}\n{README_END}{tail}"
            readme.write_text(body)
            log("bench/README.md updated")
    return stem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5k files only, few iterations (a few minutes)")
    parser.add_argument("--name", help="results name (default: quick or full)")
    parser.add_argument("--sizes", help="comma-separated tree sizes, e.g. 5000,50000")
    parser.add_argument("--iterations", type=int, help="timed iterations per case (all sizes)")
    parser.add_argument("--cases", help="comma-separated subset of cases, e.g. clean,changed-10")
    parser.add_argument("--only", help=f"comma-separated phases among {', '.join(PHASES)}")
    parser.add_argument("--skip", help="comma-separated phases to leave out")
    parser.add_argument("--sessions", help="comma-separated session counts for the scale run")
    parser.add_argument("--window", type=float, help="scale window in seconds")
    parser.add_argument("--worktrees", type=int, help="linked worktrees for the scale run")
    parser.add_argument("--scale-files", type=int, help="files per linked worktree for the scale run")
    parser.add_argument("--think", help="scale think time in seconds, LOW,HIGH (default 1,2)")
    parser.add_argument("--old", action="append", default=[],
                        help="another checkout whose daemon runs each scale level too, side by side")
    parser.add_argument("--profile", help="py-spy profile of the daemon in each scale window: PREFIX[.svg|.txt|.json] "
                             "gives PREFIX-N-K.svg (flame graph), .txt (collapsed stacks), .json (speedscope)")
    parser.add_argument("--profile-gil", action="store_true",
                        help="profile only the thread holding the GIL (where the daemon's Python core goes)")
    parser.add_argument("--pool", type=int, default=0, help="scale sessions share this many connections (0: one each)")
    parser.add_argument("--real-project", default="django", help="PyPI project for the real-tree case")
    parser.add_argument("--real-versions", help="comma-separated consecutive versions of it")
    parser.add_argument("--readme", action="store_true", help="put the markdown into bench/README.md")
    args = parser.parse_args(argv)
    config = _config(args)
    phases = set(args.only.split(",")) if args.only else set(PHASES)
    if args.skip:
        phases -= set(args.skip.split(","))
    unknown = phases - set(PHASES)
    if unknown:
        parser.error(f"unknown phase(s): {', '.join(sorted(unknown))}")
    name = args.name or ("quick" if args.quick else "full")
    started = time.time()
    results: dict[str, Any] = {
        "name": name,
        "date": dt.date.today().isoformat(),
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "machine": machine_info(),
        "snapshotd": _engine_version(),
        "config": {k: (v if not isinstance(v, dict) else {str(a): b for a, b in v.items()}) for k, v in config.items()},
        "phases": sorted(phases),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "trees": [],
        "cases": [],
        "real": {},
    }
    WORK.mkdir(parents=True, exist_ok=True)
    log(f"snapshotd benchmark ({name}); trees under {WORK}")

    synthetic: list[trees.Tree] = []
    if phases & {"cases", "memory"}:
        for size in config["sizes"]:
            synthetic.append(trees.synthetic(size))
    real = None
    if "real" in phases:
        project, versions = config["real_project"], config["real_versions"]
        try:
            real = trees.real_project(project, versions)
            results["real"] = {"label": f"{project} {versions[0]} → {versions[-1]} sdists, "
                                        f"{real[0].files:,} files", "versions": versions}
        except Exception as exc:
            message = f"could not get the {project} sdists ({exc}); the real-project case is skipped"
            log(message)
            results["real"] = {"skipped": message}
            real = None
    linked: list[trees.Tree] = []
    if phases & {"scale", "memory"}:
        linked = trees.linked_worktrees(config["scale_worktrees"], config["scale_files"])
    results["trees"] = [_tree_info(t) for t in synthetic] + ([_tree_info(real[0])] if real else []) + (
        [{"name": f"{len(linked)} linked worktrees", "files": linked[0].files * len(linked),
          "bytes": linked[0].bytes * len(linked), "kind": "linked"}] if linked else [])

    try:
        trio.run(_main_async, config, results, phases, synthetic, real, linked)
        if "spawn" in phases:
            log("spawn helper against the usual ways")
            results["spawn"] = spawn_load.run(args.quick, log=lambda m: log(m.strip()))
    except BaseException:
        results["error"] = traceback.format_exc()
        results["duration_s"] = round(time.time() - started, 1)
        results["checks"] = report.checks(results)
        stem = _write(results, False)
        log(f"failed; partial results in {stem}.json")
        raise
    results["duration_s"] = round(time.time() - started, 1)
    results["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    results["checks"] = report.checks(results)
    results["slower_than_peers"] = report.slower_than_peers(results)
    stem = _write(results, args.readme)
    log(f"done in {results['duration_s'] / 60:.1f} min: {stem}.json, .md, .png")
    for key, check in results["checks"].items():
        if isinstance(check, dict) and "pass" in check:
            log(f"  {key}: {report._verdict(check['pass'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
