"""Launch-argument values that are lists: `camera_topics:=/front/image_raw,/left/image_raw`."""
from __future__ import annotations

from wam_diff_core.errors import WamDiffError


class LaunchArgumentError(WamDiffError, ValueError):
    """A launch argument whose text does not spell what it must."""


def parse_topic_list(text: str) -> list[str]:
    """'/a,/b' or "['/a', '/b']" -> ['/a', '/b']; '' -> [] (unset: the parameter file's value).

    Each name must be a ROS topic name (no spaces, no empty entries)."""
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    if not body.strip():
        return []
    topics = [t.strip().strip("'\"") for t in body.split(",")]
    if any(not t or any(c.isspace() for c in t) for t in topics):
        raise LaunchArgumentError(f"camera_topics {text!r}: expected topic names separated by commas, "
                                  "e.g. /front/image_raw,/left/image_raw")
    return topics
