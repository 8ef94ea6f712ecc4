"""One result written the way the analysis scripts write theirs: STEM.json, STEM.md (the table, also printed) and,
given a plot function, STEM.png."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional


def write_outputs(out: Path, stem: str, result, table: str,
                  plot: Optional[Callable[[object, Path], None]] = None) -> list[Path]:
    """result: anything JSON can hold; plot(result, path) draws STEM.png."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    paths[1].write_text(table)
    if plot is not None:
        paths.append(out / f"{stem}.png")
        plot(result, paths[-1])
    print(table, end="" if table.endswith("\n") else "\n")
    print("written: " + ", ".join(str(p) for p in paths))
    return paths
