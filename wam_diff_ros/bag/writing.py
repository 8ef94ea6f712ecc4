"""Writing a rosbag2 (MCAP by default, or sqlite3) whose topics carry their message definitions, so Foxglove, RViz
and `ros2 bag` open it without this package."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .errors import BagError

from .topics import LATCHED_TOPICS

STORAGES = ("mcap", "sqlite3")
BAG_VERSION = 9  # the rosbag2 metadata version ROS 2 Jazzy writes


def latched_qos():
    """The offered QoS recorded for a latched topic (reliable, transient local, depth 1), so `ros2 bag play` latches
    it again."""
    from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

    never = QosTime(0, 0)
    return Qos(QosHistory.KEEP_LAST, 1, QosReliability.RELIABLE, QosDurability.TRANSIENT_LOCAL, never, never,
               QosLiveliness.AUTOMATIC, never, False)


class BagWriter:
    """`with BagWriter(path, store) as bag: bag.write(topic, msgtype, log_ns, msg)`; connections are added on a
    topic's first message, `custom` lands in metadata.yaml's custom_data."""

    def __init__(self, path, store, storage: str = "mcap", custom: Optional[dict] = None):
        from rosbags.rosbag2 import StoragePlugin, Writer, WriterError

        if storage not in STORAGES:
            raise BagError(f"storage {storage!r}: expected one of {list(STORAGES)}")
        self.path = Path(path)
        if self.path.exists():
            raise BagError(f"output bag {self.path} exists already; choose a new path (a bag is never overwritten)")
        self.store = store
        plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
        try:
            self._writer = Writer(self.path, version=BAG_VERSION, storage_plugin=plugin)
        except WriterError as exc:
            raise BagError(f"cannot write bag {self.path}: {exc}") from None
        for key, value in (custom or {}).items():
            self._writer.set_custom_data(str(key), str(value))
        self._connections: dict = {}
        self.counts: dict[str, int] = {}

    def __enter__(self) -> "BagWriter":
        self._writer.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._writer.close()
        if exc_type is not None:  # a half-written bag would only block the rerun: gone
            import shutil

            shutil.rmtree(self.path, ignore_errors=True)

    def write(self, topic: str, msgtype: str, log_ns: int, msg) -> None:
        """Serialize `msg` (a rosbags instance of `msgtype`) and append it at receive time `log_ns`."""
        conn = self._connections.get(topic)
        if conn is None:
            qos = [latched_qos()] if topic in LATCHED_TOPICS else []
            conn = self._connections[topic] = self._writer.add_connection(topic, msgtype, typestore=self.store,
                                                                          offered_qos_profiles=qos)
            self.counts[topic] = 0
        self._writer.write(conn, int(log_ns), self.store.serialize_cdr(msg, msgtype))
        self.counts[topic] += 1
