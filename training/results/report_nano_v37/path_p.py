"""(p)'s path from nothing by its rule (training/recipes/nano_s_p.yaml, bar 4): each step's wall as measured in this
run (runs/fast/recipe.json), the steps whose outputs were reused at the walls of the runs that made them.

    python training/results/report_nano_v37/path_p.py runs/fast/recipe.json
"""
import json
import sys
from pathlib import Path

# Reused outputs (digests equal to those runs' records): v29's data walls, v27's bending and first AR stage.
REUSED_S = {"data_plan": 140.0, "data_v1": 40.0, "data_lateral": 29.0, "data_junction": 107.0,
            "bending": 0.3, "ar": 1383.5}
BAR_S = 10_800.0
OUT = Path(__file__).with_suffix(".json")  # path_p.json, beside this script


def main(record_path: str) -> int:
    rows = {r["name"]: r for r in json.load(open(record_path))["steps"]}
    path = []
    for name, row in rows.items():
        if row["status"] == "ok":
            path.append((name, row["wall_s"], "this run"))
        elif name in REUSED_S:
            path.append((name, REUSED_S[name], "reused"))
    total = sum(w for _, w, _ in path)
    for name, wall, where in path:
        print(f"{name:18s} {wall:8.1f} s  {where}")
    print(f"{'path':18s} {total:8.1f} s  ({total / 3600:.2f} h; bar {BAR_S:.0f} s: {'met' if total <= BAR_S else 'not met'})")
    with open(OUT, "w") as f:
        json.dump({"steps": [{"name": n, "wall_s": w, "source": s} for n, w, s in path], "total_s": round(total, 1),
                   "bar_s": BAR_S, "met": total <= BAR_S}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
