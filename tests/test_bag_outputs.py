"""The bag tools build the planner's messages without rclpy: field for field what the node publishes
(wam_diff_ros/plan_messages.py), the same type hashes as the built interfaces, and the node's default topics."""
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rosbags", reason="rosbags (requirements-data.txt) not installed")
rclpy = pytest.importorskip("rclpy", reason="ROS 2 wheels (requirements-ros.txt) not installed")
pytest.importorskip("wam_diff_msgs", reason="wam_diff_msgs not built (scripts/install_ros.sh)")

from rclpy.serialization import serialize_message  # noqa: E402

from wam_diff_core.types import Candidate, Detection, Plan  # noqa: E402
from wam_diff_ros.bag import plan_outputs  # noqa: E402
from wam_diff_ros.bag import topics as T  # noqa: E402
from wam_diff_ros.bag.messages import blank  # noqa: E402
from wam_diff_ros.bag.typestore import find_msg_dir, typestore  # noqa: E402

STAMP_NS = 12 * 10**9 + 345_000_000
PLANS = {
    "valid": Plan(trajectory=np.array([[2.0 * k, 0.1 * k * k] for k in range(1, 9)]), valid=True,
                  raw_text={"planning": "2.00,0.10,..."}),
    "standing": Plan(trajectory=np.zeros((8, 2)), valid=True),  # no step long enough for a heading
    "invalid": Plan(trajectory=None, valid=False, errors={"planning": "truncated"}, raw_text={"planning": "1.2,"}),
    "scored": Plan(trajectory=np.array([[1.5 * k, 0.0] for k in range(1, 9)]), valid=True, chosen=2, score=0.75,
                   candidates=[Candidate(i, np.array([[1.5 * k, 0.1 * i] for k in range(1, 9)])) for i in range(3)]
                   + [Candidate(3, None, error="unparsable")]),
}
DETECTIONS = [Detection("car", (10.0, 20.0, 50.5, 44.0), (39, 156, 197, 344), 0.83),
              Detection("truck", (0.0, 0.0, 3.0, 4.0), (0, 0, 12, 31), 1.2)]


def plain(msg):
    """A rosbags message as nested dicts and lists (numpy arrays as lists)."""
    if isinstance(msg, np.ndarray):
        return msg.tolist()
    if isinstance(msg, list):
        return [plain(v) for v in msg]
    if hasattr(msg, "__dataclass_fields__"):
        return {k: plain(getattr(msg, k)) for k in msg.__dataclass_fields__ if k != "__msgtype__"}
    if isinstance(msg, float) and msg != msg:
        return "nan"  # NaN != NaN: a NaN field (no candidate score) compares as the same value on both sides
    return msg


def _same(ours, msgtype, theirs):
    """Equal field by field once both are serialized (padding bytes aside: Fast CDR leaves them unset) and read back."""
    store = typestore()
    mine = store.deserialize_cdr(store.serialize_cdr(ours, msgtype), msgtype)
    assert plain(mine) == plain(store.deserialize_cdr(serialize_message(theirs), msgtype))
    assert len(store.serialize_cdr(ours, msgtype)) == len(serialize_message(theirs))


@pytest.fixture(scope="module")
def ros_header():
    from builtin_interfaces.msg import Time
    from std_msgs.msg import Header

    return lambda frame: Header(stamp=Time(sec=12, nanosec=345_000_000), frame_id=frame)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_trajectory_path_and_markers_equal_the_nodes_messages(name, ros_header):
    from wam_diff_ros import plan_messages as node

    plan, store = PLANS[name], typestore()
    _same(plan_outputs.trajectory_msg(store, plan, STAMP_NS, "base_link", "turn left", 32, 4, 0.25),
          "wam_diff_msgs/msg/Trajectory", node.trajectory_msg(plan, ros_header("base_link"), "turn left", 32, 4, 0.25))
    _same(plan_outputs.path_msg(store, plan, STAMP_NS, "base_link"), "nav_msgs/msg/Path",
          node.path_msg(plan, ros_header("base_link")))
    _same(plan_outputs.marker_array_msg(store, plan, STAMP_NS, "base_link"), "visualization_msgs/msg/MarkerArray",
          node.marker_array_msg(plan, ros_header("base_link")))


def test_detections_and_answer_equal_the_nodes_messages(ros_header):
    from wam_diff_msgs.msg import DrivingAnswer
    from wam_diff_ros import plan_messages as node

    store, frame = typestore(), T.CAMERA_FRAME_ID
    _same(plan_outputs.detections_msg(store, DETECTIONS, STAMP_NS, frame), "wam_diff_msgs/msg/Detection2DArray",
          node.detections_msg(DETECTIONS, ros_header(frame)))
    _same(plan_outputs.answer_msg(store, STAMP_NS, frame, "Is the left lane free?", "yes", 0.5),
          "wam_diff_msgs/msg/DrivingAnswer",
          DrivingAnswer(header=ros_header(frame), question="Is the left lane free?", answer="yes", latency_s=0.5))


@pytest.mark.parametrize("msgtype", ["visualization_msgs/msg/Marker", "nav_msgs/msg/Odometry", "sensor_msgs/msg/Image",
                                     "wam_diff_msgs/msg/Trajectory", "wam_diff_msgs/msg/Detection2D"])
def test_a_blank_message_equals_rclpys_default_instance(msgtype):
    import importlib

    package, _, name = msgtype.partition("/msg/")
    _same(blank(typestore(), msgtype), msgtype, getattr(importlib.import_module(f"{package}.msg"), name)())


def test_type_hashes_equal_the_built_interfaces_where_their_definitions_are_the_repositorys():
    """RIHS01 hashes (what a bag records per topic) of the typestore against rosidl's, from the installed type
    description files; a wam_diff_msgs type counts only when its installed .msg is the repository's (a stale build
    is `make install`'s business)."""
    import sys

    share = Path(sys.prefix) / "share"
    checked = 0
    for msgtype in ["sensor_msgs/msg/Image", "nav_msgs/msg/Odometry", "visualization_msgs/msg/MarkerArray"] + [
            f"wam_diff_msgs/msg/{p.stem}" for p in sorted(find_msg_dir().glob("*.msg"))]:
        package, _, name = msgtype.partition("/msg/")
        described = share / package / "msg" / f"{name}.json"
        installed = share / package / "msg" / f"{name}.msg"
        if not described.is_file() or (package == "wam_diff_msgs" and (
                installed.read_text() != (find_msg_dir() / f"{name}.msg").read_text())):
            continue
        want = json.loads(described.read_text())["type_hashes"][0]["hash_string"]
        assert typestore().hash_rihs01(msgtype) == want, msgtype
        checked += 1
    assert checked >= 4


def test_bag_topics_are_the_planner_and_bridge_defaults():
    from wam_diff_ros.highway_bridge_node import PARAMETERS as BRIDGE
    from wam_diff_ros.highway_bridge_node import TOP_DOWN_HEIGHT_M, TOP_DOWN_ROTATION, top_down_mount
    from wam_diff_ros.planner_node import PARAMETERS as PLANNER
    from wam_diff_ros.bag import record

    def absolute(name):
        return name if name.startswith("/") else "/" + name

    planner = {k: v[0] for k, v in PLANNER.items()}
    assert planner["camera_topics"] == [T.CAMERA_TOPIC] and absolute(planner["odometry_topic"]) == T.ODOMETRY_TOPIC
    assert absolute(planner["command_topic"]) == T.COMMAND_TOPIC
    assert absolute(planner["route_target_topic"]) == T.ROUTE_TARGET_TOPIC
    assert (planner["base_frame_id"], planner["sync_slop_s"], planner["route_target_max_age_s"],
            planner["default_command"]) == (T.BASE_FRAME_ID, T.SYNC_SLOP_S, T.ROUTE_TARGET_MAX_AGE_S, T.DEFAULT_COMMAND)
    bridge = {k: v[0] for k, v in BRIDGE.items()}
    assert [absolute(bridge[k]) for k in ("camera_topic", "odometry_topic", "command_topic", "route_target_topic")] == [
        T.CAMERA_TOPIC, T.ODOMETRY_TOPIC, T.COMMAND_TOPIC, T.ROUTE_TARGET_TOPIC]
    assert (bridge["camera_name"], bridge["odom_frame_id"]) == (T.CAMERA_NAME, T.ODOM_FRAME_ID)
    tf = record.camera_tf_msg(typestore(), 0, 320, 160)
    mount = top_down_mount(T.CAMERA_NAME, 320, 160, 3.0, (0.25, 0.5))
    t, r = tf.transforms[0].transform.translation, tf.transforms[0].transform.rotation
    assert (t.x, t.y, t.z) == pytest.approx(mount.xyz) and t.z == TOP_DOWN_HEIGHT_M
    assert (r.x, r.y, r.z, r.w) == TOP_DOWN_ROTATION
