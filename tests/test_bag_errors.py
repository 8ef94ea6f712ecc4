"""A bag the planner tools cannot use is one line naming the bag and the topic, exit status 2: truncated files
(MCAP and sqlite3), topics of unknown or unexpected types, a missing topic, a message that does not deserialize."""
import numpy as np
import pytest

pytest.importorskip("rosbags", reason="rosbags (requirements-data.txt) not installed")

from wam_diff_ros.bag import topics as T  # noqa: E402
from wam_diff_ros.bag.cli import main  # noqa: E402
from wam_diff_ros.bag.errors import BagError  # noqa: E402
from wam_diff_ros.bag.messages import blank, header  # noqa: E402
from wam_diff_ros.bag.reading import BagReader  # noqa: E402
from wam_diff_ros.bag.typestore import typestore  # noqa: E402
from wam_diff_ros.bag.writing import BagWriter  # noqa: E402

FRAMES = 20


def write_bag(path, storage="mcap", camera_type=T.IMAGE, extra=()):
    """A synthetic drive: FRAMES ticks of odometry then a 32x16 camera frame, 10 Hz; `extra` (topic, type, msg)
    written at every tick too."""
    store = typestore()
    with BagWriter(path, store, storage) as bag:
        for k in range(FRAMES):
            ns = k * 100_000_000
            odom = blank(store, T.ODOMETRY, header=header(store, ns, "odom"))
            odom.twist.twist.linear.x = 10.0
            bag.write(T.ODOMETRY_TOPIC, T.ODOMETRY, ns, odom)
            for topic, msgtype, msg in extra:
                bag.write(topic, msgtype, ns, msg)
            if camera_type == T.IMAGE:
                data = np.full(32 * 16 * 3, k, np.uint8)
                bag.write(T.CAMERA_TOPIC, T.IMAGE, ns, blank(store, T.IMAGE, header=header(store, ns, "camera_front"),
                                                             height=16, width=32, encoding="rgb8", step=96, data=data))
    return path


def run_cli(capsys, *argv):
    rc = main(list(argv))
    err = capsys.readouterr().err.strip()
    return rc, err


def test_an_mcap_bag_cut_short_names_the_topic_whose_message_it_cuts_and_how_many_are_left(tmp_path, capsys):
    bag = write_bag(tmp_path / "cut")
    mcap = next(bag.glob("*.mcap"))
    data = mcap.read_bytes()
    mcap.write_bytes(data[:len(data) * 2 // 3])  # the end falls inside the chunk of messages
    rc, err = run_cli(capsys, "replay", str(bag), "--model", "fake", "--out", str(tmp_path / "out"), "--no-progress")
    assert rc == 2 and err.count("\n") == 0
    assert err.startswith(f"wam-diff-bag replay: error: bag {bag} is truncated or corrupt")
    topic, rest = err.split("; topic ")[1].split(": ", 1)
    assert topic in (T.ODOMETRY_TOPIC, T.CAMERA_TOPIC)  # the message the end falls in
    left = int(rest.split(" of ")[0])
    assert rest.startswith(f"{left} of {FRAMES} messages complete") and 10 <= left < FRAMES
    assert not (tmp_path / "out").exists()


def test_a_truncated_sqlite3_bag_names_its_topics(tmp_path, capsys):
    bag = write_bag(tmp_path / "cut", storage="sqlite3")
    db = next(bag.glob("*.db3"))
    db.write_bytes(db.read_bytes()[:db.stat().st_size // 2])
    rc, err = run_cli(capsys, "to-dataset", str(bag), "--out", str(tmp_path / "ds"), "--no-progress")
    assert rc == 2 and err.count("\n") == 0
    assert "truncated or corrupt" in err and f"topic {T.ODOMETRY_TOPIC}: 0 of {FRAMES} messages complete" in err


def test_a_camera_topic_of_an_unknown_type_is_named_with_the_types_expected(tmp_path, capsys):
    """A bag whose camera topic carries a type of someone else's package (its definition stored in the bag)."""
    from rosbags.typesys import Stores, get_typestore, get_types_from_msg

    store = get_typestore(Stores.ROS2_JAZZY)
    store.register(get_types_from_msg("uint32 seq\nuint8[] pixels", "acme_msgs/msg/Frame"))
    path = tmp_path / "acme"
    with BagWriter(path, store) as bag:
        bag.write(T.CAMERA_TOPIC, "acme_msgs/msg/Frame", 0,
                  store.types["acme_msgs/msg/Frame"](seq=1, pixels=np.zeros(4, np.uint8)))
    rc, err = run_cli(capsys, "replay", str(path), "--model", "fake", "--out", str(tmp_path / "out"))
    assert rc == 2 and err == (f"wam-diff-bag replay: error: bag {path}: topic {T.CAMERA_TOPIC} has type "
                               f"acme_msgs/msg/Frame; expected {T.IMAGE} or {T.COMPRESSED_IMAGE}")


def test_an_odometry_topic_of_another_type_and_a_missing_camera_topic_are_named(tmp_path):
    store = typestore()
    odd = write_bag(tmp_path / "odd", extra=[("/odom_str", T.STRING, blank(store, T.STRING, data="x"))])
    with pytest.raises(BagError, match=f"topic /odom_str has type {T.STRING}; expected {T.ODOMETRY}$"):
        from wam_diff_ros.bag.to_dataset import to_dataset

        to_dataset([odd], tmp_path / "ds", odometry_topic="/odom_str", progress=False)
    with pytest.raises(BagError, match=f"has no topic /front/image_raw .*its topics: {T.CAMERA_TOPIC} "):
        from wam_diff_ros.bag.replay import replay
        from wam_diff_ros.fake_policy import FakePolicy

        replay(odd, FakePolicy(), tmp_path / "out", camera_topics=["/front/image_raw"], progress=False)


def test_a_message_that_does_not_deserialize_names_its_topic_and_index(tmp_path):
    from rosbags.rosbag2 import Writer

    store = typestore()
    path = tmp_path / "garbage"
    with Writer(path, version=9) as writer:
        conn = writer.add_connection(T.ODOMETRY_TOPIC, T.ODOMETRY, typestore=store)
        good = store.serialize_cdr(blank(store, T.ODOMETRY, header=header(store, 0, "odom")), T.ODOMETRY)
        writer.write(conn, 0, good)
        writer.write(conn, 100_000_000, bytes(good[:40]))  # cut inside the covariance
    with BagReader(path) as bag, pytest.raises(BagError, match=f"message 2 on topic {T.ODOMETRY_TOPIC} "
                                                              f"\\({T.ODOMETRY}\\) does not deserialize"):
        list(bag.messages([T.ODOMETRY_TOPIC]))


def test_an_existing_output_bag_is_never_overwritten(tmp_path, capsys):
    bag = write_bag(tmp_path / "in")
    (tmp_path / "out").mkdir()
    rc, err = run_cli(capsys, "replay", str(bag), "--model", "fake", "--out", str(tmp_path / "out"))
    assert rc == 2 and "output bag" in err and "exists already" in err
    rc, err = run_cli(capsys, "replay", str(bag), "--model", "fake", "--out", str(tmp_path / "ok"), "--no-progress")
    assert rc == 0 and (tmp_path / "ok" / "metadata.yaml").is_file()
