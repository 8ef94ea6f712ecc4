"""`wam-diff-bag record` -> `replay`: an expert drive of the embedded world written as a rosbag2, then planned frame set
by frame set into a new bag whose topics, counts and stored definitions are read back with rosbags."""
import math

import numpy as np
import pytest

pytest.importorskip("rosbags", reason="rosbags (requirements-data.txt) not installed")
pytest.importorskip("highway_env", reason="embedded world dependencies not installed")

from wam_diff_core.sim.routes import Route  # noqa: E402
from wam_diff_ros.bag import topics as T  # noqa: E402
from wam_diff_ros.bag.reading import BagReader  # noqa: E402
from wam_diff_ros.bag.record import record  # noqa: E402
from wam_diff_ros.bag.replay import replay  # noqa: E402
from wam_diff_ros.fake_policy import FakePolicy  # noqa: E402

ROUTE = Route("bag_highway", "highway", 7, 0.5, 60.0, 2.0, {"lanes": 3, "vehicles": 4, "ego_speed": 20.0})
TICKS = 21  # 2 s at 10 Hz, tick 0 included


@pytest.fixture(scope="module")
def drive(tmp_path_factory):
    """The route recorded as an MCAP bag, and the same drive's ticks from the world itself."""
    from wam_diff_core.sim.highway import ExpertDrive

    path = tmp_path_factory.mktemp("bags") / "drive"
    summary = record(ROUTE, path, progress=False)
    ticks = [tick for _, tick in ExpertDrive(ROUTE, every=1)]
    return path, summary, ticks


def node_egos(ticks):
    """The ego state the planner node derives from the odometry of each tick (accelerations by finite differences)."""
    from wam_diff_core.types import EgoState

    out, prev = [], None
    for tick in ticks:
        ax = ay = 0.0
        if prev is not None:
            ax, ay = (tick.ego.vx - prev.ego.vx) / 0.1, (tick.ego.vy - prev.ego.vy) / 0.1
        out.append(EgoState(tick.ego.vx, tick.ego.vy, ax, ay, tick.ego.yaw_rate))
        prev = tick
    return out


def test_record_writes_every_tick_on_the_planner_topics_with_simulated_stamps(drive):
    path, summary, ticks = drive
    assert summary["ticks"] == len(ticks) == TICKS
    with BagReader(path) as bag:
        assert bag.topics == {T.TF_STATIC_TOPIC: (T.TF_MESSAGE, 1), T.CLOCK_TOPIC: (T.CLOCK, TICKS),
                              T.ODOMETRY_TOPIC: (T.ODOMETRY, TICKS), T.COMMAND_TOPIC: (T.STRING, 1),  # on change
                              T.CAMERA_TOPIC: (T.IMAGE, TICKS)}
        [tf] = [m.msg for m in bag.messages([T.TF_STATIC_TOPIC])]
        odom = [m for m in bag.messages([T.ODOMETRY_TOPIC])]
        images = [m for m in bag.messages([T.CAMERA_TOPIC])]
        assert '"route_id": "bag_highway"' in bag.custom["wam_diff.route"]
    assert [m.log_ns for m in odom] == [k * 100_000_000 for k in range(TICKS)]
    for m, tick in zip(odom, ticks):
        pose = m.msg.pose.pose
        assert (pose.position.x, pose.position.y) == pytest.approx(tick.pose[:2], abs=1e-9)
        assert 2 * math.atan2(pose.orientation.z, pose.orientation.w) == pytest.approx(
            math.remainder(tick.pose[2], 2 * math.pi), abs=1e-9)
        assert m.msg.twist.twist.linear.x == tick.ego.vx and m.msg.child_frame_id == T.BASE_FRAME_ID
    frame = images[5].msg
    assert (frame.height, frame.width, frame.encoding, frame.step) == (128, 256, "rgb8", 768)
    assert frame.header.frame_id == "camera_front_optical_frame"
    assert [(t.header.frame_id, t.child_frame_id) for t in tf.transforms] == [
        ("base_link", "camera_front_link"), ("camera_front_link", "camera_front_optical_frame")]
    # the link above the image centre: the ego sits a quarter in, so the centre is 256 / 4 px / 3 px/m ahead
    assert tf.transforms[0].transform.translation.x == pytest.approx(256 / 4 / 3.0)
    assert np.array_equal(frame.data.reshape(128, 256, 3), ticks[5].frame)


def test_replay_plans_equal_planning_the_same_frames_through_driving_policy(drive, nano, one_thread, tmp_path):
    """Every frame set becomes one plan, made from the same frame, ego state and command as calling DrivingPolicy
    on the world's own ticks: the model texts agree one for one."""
    from wam_diff_core.decoding.config import resolve_decoding
    from wam_diff_core.policy import DrivingPolicy

    path, _, ticks = drive
    policy = DrivingPolicy(nano, resolve_decoding(nano.settings.decoding, max_new_tokens=12))  # short texts: fast
    summary = replay(path, policy, tmp_path / "out", progress=False)
    assert summary["plans"] == TICKS and summary["frames_rejected"] == 0
    direct = [policy.plan([t.frame], ego, t.command).raw_text["planning"] for t, ego in zip(ticks, node_egos(ticks))]
    with BagReader(tmp_path / "out") as bag:
        replayed = [m.msg for m in bag.messages([T.OUTPUTS["trajectory"][0]])]
    assert [m.raw_text for m in replayed] == direct
    assert len(set(direct)) > 1  # the texts depend on the frames: a mix-up of frames would show
    assert [m.header.stamp.sec * 10**9 + m.header.stamp.nanosec for m in replayed] == [k * 10**8 for k in range(TICKS)]
    assert {m.command for m in replayed} == {"follow lane"} and replayed[0].block_size == policy.config.block_size


def test_output_bag_reads_back_with_the_five_output_topics_their_counts_and_definitions(drive, tmp_path):
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    path, _, ticks = drive
    policy = FakePolicy(tasks=("planning", "detection"))
    summary = replay(path, policy, tmp_path / "out", tasks=("planning", "detection"), questions=["How many?"],
                     ask_every=5, progress=False)
    assert summary["invalid_plans"] == 0 and summary["answers"] == 5  # frame sets 0, 5, 10, 15, 20
    expected = {T.OUTPUTS["trajectory"]: TICKS, T.OUTPUTS["path"]: TICKS, T.OUTPUTS["markers"]: TICKS,
                T.OUTPUTS["detections"]: TICKS, T.OUTPUTS["answer"]: 5}
    with BagReader(tmp_path / "out") as bag:
        assert {(t, m): n for t, (m, n) in bag.topics.items()} == expected
    # what Foxglove does: the types from the definitions stored in the bag alone (an empty typestore)
    with AnyReader([tmp_path / "out"], default_typestore=get_typestore(Stores.EMPTY)) as reader:
        msgs = {c.topic: reader.deserialize(raw, c.msgtype)
                for c, _, raw in reader.messages() if c.topic in ("/trajectory", "/detections", "/markers")}
    traj = msgs["/trajectory"]
    assert traj.valid and len(traj.points) == 8 and traj.points[-1].time_from_start.sec == 4
    assert traj.points[0].pose.position.x == pytest.approx(0.5 * ticks[-1].ego.vx)  # the fake plans at the ego speed
    box = msgs["/detections"].detections[0]
    assert box.results[0].hypothesis.class_id == "car" and box.bbox.size_x == pytest.approx(64.0)
    assert [m.type for m in msgs["/markers"].markers] == [4, 7] and len(msgs["/markers"].markers[0].points) == 9


@pytest.mark.parametrize("storage,image", [("sqlite3", "png")])
def test_sqlite3_bag_of_png_frames_replays_the_same_frames_and_ego_as_the_mcap_raw_bag(drive, tmp_path, storage, image):
    path, _, _ = drive
    other = tmp_path / "png"
    summary = record(ROUTE, other, storage=storage, image=image, progress=False)
    assert summary["messages"][T.CAMERA_TOPIC + "/compressed"] == TICKS and any(other.glob("*.db3"))
    calls = {}
    for name, bag, camera in (("raw", path, T.CAMERA_TOPIC), ("png", other, T.CAMERA_TOPIC + "/compressed")):
        policy = FakePolicy()
        replay(bag, policy, tmp_path / f"out_{name}", camera_topics=[camera], progress=False)
        calls[name] = [(c["mean"], c["ego"], c["command"]) for c in policy.plan_calls]
    assert len(calls["raw"]) == TICKS and calls["png"] == calls["raw"]  # PNG is lossless


def test_record_with_a_policy_drives_the_closed_loop_and_plans_every_fourth_tick(tmp_path):
    """The constant-velocity policy keeps the ego at its start speed; the world asks it at ticks 0, 4, 8, ..."""
    from wam_diff_core.sim.policies import ConstantVelocityPolicy

    calls = []

    class Counting(ConstantVelocityPolicy):
        def plan(self, images, ego, command, target=None):
            calls.append(ego.vx)
            return super().plan(images, ego, command, target)

    summary = record(ROUTE, tmp_path / "policy", policy=Counting(), driver="constant-velocity", progress=False)
    assert summary["ticks"] == TICKS and len(calls) == 5  # ticks 0, 4, ..., 16; tick 20 ends the route
    with BagReader(tmp_path / "policy") as bag:
        speeds = [m.msg.twist.twist.linear.x for m in bag.messages([T.ODOMETRY_TOPIC])]
        assert bag.custom["wam_diff.driver"] == "constant-velocity"
    assert speeds[0] == 20.0 and max(abs(v - 20.0) for v in speeds) < 0.5
