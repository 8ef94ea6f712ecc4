"""The rosbags typestore of the planner's messages: ROS 2 Jazzy's standard types plus wam_diff_msgs, whose
definitions are read from their .msg files when first needed, so a bag stores the definitions the interface
package is built from (Foxglove and RViz read them from the bag). Where: the repository's msg/msg in a source
checkout, else share/wam_diff_msgs/msg of an install (this Python's prefix, then AMENT_PREFIX_PATH)."""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Optional

from .errors import BagError

PACKAGE = "wam_diff_msgs"
_REPO_MSG_DIR = Path(__file__).resolve().parents[2] / "msg" / "msg"


def msg_dir_candidates() -> list[Path]:
    """Where the wam_diff_msgs .msg files are looked for, in order."""
    prefixes = [sys.prefix] + [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    return [_REPO_MSG_DIR] + [Path(p) / "share" / PACKAGE / "msg" for p in prefixes]


def find_msg_dir() -> Path:
    """The first candidate directory holding .msg files; a BagError naming every place looked in otherwise."""
    for path in msg_dir_candidates():
        if path.is_dir() and any(path.glob("*.msg")):
            return path
    looked = ", ".join(str(p) for p in msg_dir_candidates())
    raise BagError(f"no {PACKAGE} message definitions (*.msg) found; looked in {looked}")


def package_types(msg_dir: Path) -> dict:
    """rosbags type definitions of every .msg file in `msg_dir`, named wam_diff_msgs/msg/<file stem>."""
    from rosbags.typesys import TypesysError, get_types_from_msg

    types: dict = {}
    for path in sorted(Path(msg_dir).glob("*.msg")):
        try:
            types.update(get_types_from_msg(path.read_text(), f"{PACKAGE}/msg/{path.stem}"))
        except (TypesysError, ValueError, OSError) as exc:
            raise BagError(f"message definition {path} does not parse: {' '.join(str(exc).split())}") from None
    return types


@functools.lru_cache(maxsize=4)
def typestore(msg_dir: Optional[str] = None):
    """ROS 2 Jazzy's types and wam_diff_msgs (from `msg_dir`, default `find_msg_dir()`), built once per directory."""
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_JAZZY)
    store.register(package_types(Path(msg_dir) if msg_dir else find_msg_dir()))
    return store
