"""`wam-diff-bag replay BAG --realtime`: the bag published into a running ROS 2 graph over DDS at its recorded rate
(what `ros2 bag play` does), for a live planner node to plan on. Messages go out as recorded, serialized, without
being decoded. Every publisher is reliable and transient local (depth 10): subscribers of any reliability and
durability accept it, the planner's latched command subscription included."""
from __future__ import annotations

import importlib
import time
from collections import Counter
from typing import Optional, Sequence

from .errors import BagError
from .reading import BagReader


def message_class(topic: str, msgtype: str):
    """The rclpy message class of `msgtype` (pkg/msg/Name); a BagError naming the topic when it is not installed."""
    package, _, name = msgtype.partition("/msg/")
    try:
        return getattr(importlib.import_module(f"{package}.msg"), name)
    except (ImportError, AttributeError, ValueError):
        raise BagError(f"topic {topic}: message type {msgtype} is not installed for rclpy (no module {package}.msg "
                       f"with {name})") from None


def _remap(topic: str, namespace: str) -> str:
    return topic if not namespace else "/" + "/".join(p for p in (namespace.strip("/"), topic.strip("/")) if p)


def play(bag_path, *, rate: float = 1.0, delay_s: float = 0.5, topics: Optional[Sequence[str]] = None,
         namespace: str = "", context=None, progress: bool = True) -> dict:
    """Publish `topics` of the bag (default: all) at `rate` times the recorded pace, after `delay_s` for
    discovery; every topic under `namespace` when given. Returns messages published per topic and the wall time."""
    import rclpy
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    if not rate > 0:
        raise BagError(f"--rate {rate}: expected a positive factor of the recorded pace")
    own_context = context is None
    if own_context:
        from rclpy.context import Context

        context = Context()
        rclpy.init(context=context)
    node = rclpy.create_node("wam_diff_bag_player", context=context)
    published: Counter = Counter()
    try:
        with BagReader(bag_path) as reader:
            chosen = list(reader.topics) if topics is None else list(topics)
            for t in chosen:
                if t not in reader.topics:
                    raise BagError(f"bag {bag_path} has no topic {t}; its topics: {', '.join(sorted(reader.topics))}")
            qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
            pubs = {t: node.create_publisher(message_class(t, reader.topics[t][0]), _remap(t, namespace), qos)
                    for t in chosen}
            time.sleep(max(0.0, delay_s))
            wall0 = time.perf_counter()
            first = None
            bar = _bar(progress, sum(reader.topics[t][1] for t in chosen))
            for topic, _, log_ns, data in reader.raw_messages(chosen):
                first = log_ns if first is None else first
                wait = (log_ns - first) * 1e-9 / rate - (time.perf_counter() - wall0)
                if wait > 0:
                    time.sleep(wait)
                pubs[topic].publish(bytes(data))
                published[topic] += 1
                if bar is not None:
                    bar.update(1)
            if bar is not None:
                bar.close()
            wall = time.perf_counter() - wall0
    finally:
        node.destroy_node()
        if own_context:
            rclpy.try_shutdown(context=context)
    return {"bag": str(bag_path), "published": dict(published), "wall_s": round(wall, 3), "rate": rate}


def _bar(progress: bool, total: int):
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="play", unit="msg")
