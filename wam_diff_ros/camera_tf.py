"""Where the bridges' cameras sit: static transforms base_link -> <camera>_link -> <camera>_optical_frame.

Frames (REP 103): `<camera>_link` is the camera body, x along the view, y left, z up;
`<camera>_optical_frame` is the frame of the image, x right, y down, z along the view; images are
stamped with it. The link -> optical rotation is the same for every camera (OPTICAL_ROTATION). Both
transforms of every camera go out once on /tf_static as one tf2_msgs/TFMessage (transient local), so
a subscriber that comes later (RViz, tf2 buffers) still gets them. Without tf2_msgs (PyPI has no wheel;
every ROS 2 distro has it) nothing is published and the bridge says so once.
ROS message modules are imported inside the functions: the CARLA bridge imports this before it
starts ROS.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

Quaternion4 = tuple[float, float, float, float]  # (x, y, z, w)

# <camera>_link -> <camera>_optical_frame: optical z = link x (view), optical x = -link y (right),
# optical y = -link z (down); roll -pi/2 then yaw -pi/2.
OPTICAL_ROTATION: Quaternion4 = (-0.5, 0.5, -0.5, 0.5)


def quaternion_from_rpy(roll: float, pitch: float, yaw: float) -> Quaternion4:
    """(x, y, z, w) of the rotation by roll about x, then pitch about y, then yaw about z (fixed axes, radians)."""
    cr, sr = math.cos(roll / 2), math.sin(roll / 2)
    cp, sp = math.cos(pitch / 2), math.sin(pitch / 2)
    cy, sy = math.cos(yaw / 2), math.sin(yaw / 2)
    return (sr * cp * cy - cr * sp * sy, cr * sp * cy + sr * cp * sy, cr * cp * sy - sr * sp * cy,
            cr * cp * cy + sr * sp * sy)


@dataclass(frozen=True)
class CameraMount:
    """A camera on the ego: `name` (frames `<name>_link`, `<name>_optical_frame`), position of its link frame
    in the base frame (metres) and the link frame's orientation there (quaternion x, y, z, w)."""

    name: str
    xyz: tuple[float, float, float]
    rotation: Quaternion4 = (0.0, 0.0, 0.0, 1.0)

    @property
    def link_frame(self) -> str:
        return f"{self.name}_link"

    @property
    def optical_frame(self) -> str:
        return f"{self.name}_optical_frame"


# The top-down view looks the same from any height; its camera is drawn this high above the image centre.
TOP_DOWN_HEIGHT_M = 20.0
# The top-down camera's link: x (its view) straight down, y (image left) backward, z (image up) left.
TOP_DOWN_ROTATION = (-0.5, 0.5, 0.5, 0.5)


def top_down_mount(name: str, width: int, height: int, scaling: float, anchor: tuple[float, float]) -> CameraMount:
    """The embedded world's camera: a `width` x `height` top-down view of `scaling` px/m with the ego at `anchor`
    (fractions of width, height); its link sits TOP_DOWN_HEIGHT_M above the image centre, in base_link
    ((0.5 - anchor_x) width / scaling ahead, (anchor_y - 0.5) height / scaling to the left)."""
    x = (0.5 - float(anchor[0])) * width / scaling
    y = (float(anchor[1]) - 0.5) * height / scaling
    return CameraMount(name, (x, y, TOP_DOWN_HEIGHT_M), TOP_DOWN_ROTATION)


def _transform(parent: str, child: str, xyz: Sequence[float], rotation: Quaternion4, stamp):
    from geometry_msgs.msg import TransformStamped

    t = TransformStamped()
    t.header.stamp, t.header.frame_id, t.child_frame_id = stamp, parent, child
    t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = (float(v) for v in xyz)
    r = t.transform.rotation
    r.x, r.y, r.z, r.w = (float(v) for v in rotation)
    return t


def camera_transforms(mounts: Sequence[CameraMount], base_frame: str, stamp) -> list:
    """geometry_msgs/TransformStamped: base_frame -> <name>_link (the mount) and <name>_link ->
    <name>_optical_frame (OPTICAL_ROTATION, no offset) for every camera."""
    out = []
    for m in mounts:
        out.append(_transform(base_frame, m.link_frame, m.xyz, m.rotation, stamp))
        out.append(_transform(m.link_frame, m.optical_frame, (0.0, 0.0, 0.0), OPTICAL_ROTATION, stamp))
    return out


class StaticTransforms:
    """A node's /tf_static publisher (None without tf2_msgs); `publish` sends the transforms once more only
    when they changed."""

    def __init__(self, node, topic: str = "/tf_static"):
        from .topic_qos import STATIC_TF_QOS

        self.node, self.sent = node, None
        try:
            from tf2_msgs.msg import TFMessage
        except ImportError:
            self.publisher = None
            node.get_logger().info(f"tf2_msgs is not installed: no camera transforms on {topic} "
                                   "(PyPI has no tf2_msgs wheel; a ROS 2 distro has it)")
            return
        self.message = TFMessage
        self.publisher = node.create_publisher(TFMessage, topic, STATIC_TF_QOS)

    def publish(self, mounts: Sequence[CameraMount], base_frame: str) -> Optional[list]:
        """Publish the cameras' transforms (stamped now) unless the same were sent; the transforms, or None
        when nothing was published."""
        key = (tuple(mounts), base_frame)
        if self.publisher is None or key == self.sent:
            return None
        transforms = camera_transforms(mounts, base_frame, self.node.get_clock().now().to_msg())
        self.publisher.publish(self.message(transforms=transforms))
        self.sent = key
        return transforms
