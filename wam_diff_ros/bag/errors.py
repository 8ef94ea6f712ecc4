"""The one error a bag a user hands in can cause."""
from __future__ import annotations

from wam_diff_core.errors import WamDiffError


class BagError(WamDiffError, ValueError):
    """A bag that cannot be used: missing, truncated or corrupt, or a topic of an unknown or unexpected type. The
    message names the bag and, where one is to blame, the topic."""
