"""One progress bar over a report's work: samples decoded and routes driven, with an ETA, on stderr."""
from __future__ import annotations

import sys

from tqdm import tqdm


class WorkBar:
    """A tqdm bar over `total` work items. Work found already done under --out (--resume) leaves the total,
    so the rate and the ETA count only what this run does."""

    def __init__(self, total: int, enabled: bool):
        self.bar = tqdm(total=total, desc="report", unit="item", file=sys.stderr, disable=not enabled,
                        dynamic_ncols=True)

    def done(self, n: int) -> None:
        self.bar.update(n)

    def reused(self, n: int) -> None:
        if self.bar.total is not None and n:
            self.bar.total = max(self.bar.n, self.bar.total - n)
            self.bar.refresh()

    def close(self) -> None:
        self.bar.close()
