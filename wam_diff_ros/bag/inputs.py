"""The planner node's rules for its inputs, applied to bag messages in receive order: camera frames converted and
matched into frame sets (image_conversion.py, camera_sync.py, the node's own code), and the ego state, command and
route target a frame set is planned with. The ego state is ego_motion.EgoMotion, as in the node; the command and
route target rules live inside PlannerNode's callbacks (planner_node.py, which imports rclpy) and `NodeInputs`
repeats them: a command replaces the last valid one (default "follow lane"); a route target is used for a frame set whose stamp is within route_target_max_age_s of its own. A message the node rejects
(input_checks.py) is counted here as there, and changes nothing."""
from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

from wam_diff_core.types import EgoState

from ..camera_sync import ApproximateTimeSync, FrameSet, StampedFrame
from ..ego_motion import EgoMotion
from ..image_conversion import ImageLimits, compressed_msg_to_rgb, image_msg_to_rgb
from ..input_checks import command_text, odometry_sample, route_target, stamp_ns
from . import topics as T


class NodeInputs:
    """Ego state, command and route target as the planner node holds them; `rejected` counts refused messages."""

    def __init__(self, default_command: str = T.DEFAULT_COMMAND, base_frame_id: str = T.BASE_FRAME_ID,
                 route_target_max_age_s: float = T.ROUTE_TARGET_MAX_AGE_S):
        self._motion = EgoMotion()
        self.command = default_command
        self.base_frame_id = base_frame_id
        self.max_age_ns = route_target_max_age_s * 1e9
        self._target: Optional[tuple[int, tuple[float, float]]] = None
        self.rejected: Counter = Counter()

    def on_odometry(self, msg) -> None:
        try:
            s = odometry_sample(msg)
        except ValueError:
            self.rejected["odometry"] += 1
            return
        self._motion.add(s)

    @property
    def ego(self) -> EgoState:
        return self._motion.state

    @property
    def odometry_seen(self) -> bool:
        return self._motion.seen

    def on_command(self, msg) -> None:
        try:
            self.command = command_text(msg.data)
        except ValueError:
            self.rejected["commands"] += 1

    def on_route_target(self, msg) -> None:
        try:
            self._target = route_target(msg, self.base_frame_id)
        except ValueError:
            self.rejected["route_targets"] += 1

    def target_for(self, frame_stamp_ns: int) -> Optional[tuple[float, float]]:
        """The newest route target when its stamp is within the age limit of `frame_stamp_ns`, else None."""
        if self._target is None:
            return None
        target_ns, target = self._target
        return target if abs(frame_stamp_ns - target_ns) <= self.max_age_ns else None

    def feed(self, topic: str, msg, odometry_topic: str, command_topic: str, route_target_topic: str) -> None:
        """Route one non-camera message to its rule by topic."""
        if topic == odometry_topic:
            self.on_odometry(msg)
        elif topic == command_topic:
            self.on_command(msg)
        elif topic == route_target_topic:
            self.on_route_target(msg)


class Cameras:
    """Camera messages -> RGB frames -> frame sets, as the node's `_on_image` does (same limits, same matcher)."""

    def __init__(self, topics: Sequence[str], compressed: Sequence[bool], slop_s: float = T.SYNC_SLOP_S,
                 limits: ImageLimits = ImageLimits()):
        self.index = {topic: i for i, topic in enumerate(topics)}
        self.compressed = list(compressed)
        self.limits = limits
        self.sync = ApproximateTimeSync(len(topics), slop_s)
        self.rejected = 0
        self.frame_sizes: Counter = Counter()  # (W, H) of the converted frames

    def add(self, topic: str, msg) -> Optional[FrameSet]:
        """The frame set this frame completes, if any; a frame the node would reject is counted and dropped."""
        i = self.index[topic]
        try:
            stamp = stamp_ns(msg.header.stamp, "image")
            rgb = (compressed_msg_to_rgb if self.compressed[i] else image_msg_to_rgb)(msg, self.limits)
        except ValueError:
            self.rejected += 1
            return None
        self.frame_sizes[(int(rgb.shape[1]), int(rgb.shape[0]))] += 1
        return self.sync.add(i, StampedFrame(stamp, rgb, msg.header.frame_id))
