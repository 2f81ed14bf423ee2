"""The planner's run time on two or more trees of pybubble, measured in one run: `pybubble.plan` on
every Optimus setting and the quickstart, each tree in a process of its own, the trees one after
the other for each setting, several rounds; medians per tree and their ratios to the first tree.

A tree is `name=PATH`: PATH holds the `pybubble` package with its compiled core (a folder made with
`pip install --no-deps --target PATH <checkout>`), or `name=installed` for the pybubble this Python
imports. Each process plans once to warm up, then times `--repeats` plans (wall: perf_counter;
CPU: process_time, all threads) and gives their medians; the load average is read beside. A process
that imports pybubble from anywhere but its tree's folder stops the run.

    python bench/planner_ab.py --tree base=/path/to/old_site --tree new=installed [--rounds 3]
        [--repeats 3] [--settings strong_2048 strong_1536] [--out results/planner.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = sorted(p.stem for p in (ROOT / "examples" / "optimus").glob("*.yaml")) + ["quickstart"]

ONE = """
import json, os, statistics, sys, time
import pybubble
path, repeats = sys.argv[1], int(sys.argv[2])
cfg = pybubble.load_config(path)
pybubble.plan(cfg)
wall, cpu = [], []
for _ in range(repeats):
    w, c = time.perf_counter(), time.process_time()
    pybubble.plan(cfg)
    wall.append(time.perf_counter() - w)
    cpu.append(time.process_time() - c)
print(json.dumps({"wall": statistics.median(wall), "cpu": statistics.median(cpu), "load": os.getloadavg()[0],
                  "package": os.path.dirname(pybubble.__file__)}))
"""


def config_path(setting: str) -> Path:
    """The config of `setting` (an Optimus setting's name, or ``quickstart``)."""
    return ROOT / "examples" / ("quickstart.yaml" if setting == "quickstart" else f"optimus/{setting}.yaml")


def run_tree(path: str, setting: str, repeats: int) -> dict:
    """One process of tree `path` (a folder, or ``installed``) timing `setting`."""
    env = dict(os.environ)
    cmd = [sys.executable, "-c", ONE, str(config_path(setting)), str(repeats)]
    if path != "installed":
        site = os.path.dirname(os.path.dirname(__import__("numpy").__file__))  # numpy's, yaml's, ...
        env["PYTHONPATH"] = os.pathsep.join([path, site])
        cmd.insert(1, "-S")  # not the installed pybubble's path hooks
    out = subprocess.run(cmd, env=env, cwd="/", capture_output=True, text=True, check=True)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    package = d.pop("package")  # checked, not recorded (a path of this machine)
    if path != "installed" and not package.startswith(os.path.abspath(path)):
        raise SystemExit(f"--tree {path}: the process imported pybubble from elsewhere")
    return d


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="name=PATH (or name=installed)")
    parser.add_argument("--settings", nargs="*", default=SETTINGS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="one JSON line per run appended here")
    args = parser.parse_args()
    trees = [t.split("=", 1) for t in args.tree]
    if any(len(t) != 2 for t in trees):
        parser.error("--tree: give name=PATH")
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in range(1, args.rounds + 1):
        for setting in args.settings:
            for name, path in trees:
                d = run_tree(path, setting, args.repeats)
                runs.setdefault((name, setting), []).append(d)
                line = {"round": r, "tree": name, "setting": setting, **d}
                print(json.dumps(line), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(line) + "\n")
    first = trees[0][0]
    print(f"\nmedians over {args.rounds} rounds (wall / CPU s), and each tree over {first}:")
    for setting in args.settings:
        med = {name: (statistics.median(d["wall"] for d in runs[name, setting]),
                      statistics.median(d["cpu"] for d in runs[name, setting])) for name, _ in trees}
        parts = [f"{name} {w:.3f} / {c:.3f}" + ("" if name == first else
                                                 f" ({w / med[first][0]:.2f}x, {c / med[first][1]:.2f}x)")
                 for name, (w, c) in med.items()]
        print(f"{setting:18s} " + "   ".join(parts))


if __name__ == "__main__":
    main()
