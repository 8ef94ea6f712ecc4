"""Reading a rosbag2 (a directory with metadata.yaml, or a bare .mcap / .db3 file) for the planner: its topics
checked against the types expected on them, messages in receive order, every failure a BagError naming the bag
and the topic (a truncated file: the topic whose messages it cuts, and how many are left)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

from .errors import BagError
from .typestore import typestore


@dataclass(frozen=True)
class BagMessage:
    topic: str
    msgtype: str
    log_ns: int  # receive time, ns
    msg: object


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _storage_files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.iterdir() if p.suffix in (".mcap", ".db3"))


def _expected_counts(path: Path) -> dict[str, int]:
    """Messages per topic that metadata.yaml promises ({} without one or when it does not read)."""
    meta = path / "metadata.yaml"
    if not meta.is_file():
        return {}
    try:
        from ruamel.yaml import YAML

        info = YAML(typ="safe").load(meta.read_text())["rosbag2_bagfile_information"]
        return {t["topic_metadata"]["name"]: int(t["message_count"]) for t in info["topics_with_message_count"]}
    except Exception:  # noqa: BLE001 - a broken metadata file says nothing about the counts
        return {}


def _shortfall(expected: dict[str, int], got: dict[str, int], cut: Optional[str] = None) -> str:
    """'<topic>: N of M messages complete' for the cut topic, or the first topic with fewer than promised."""
    short = [t for t in expected if got.get(t, 0) < expected[t]]
    topic = cut if cut is not None else (short[0] if short else None)
    if topic is None:
        return "no topic is short of its messages"
    total = f" of {expected[topic]}" if topic in expected else ""
    others = [t for t in short if t != topic]
    more = f" (also short: {', '.join(others)})" if others else ""
    return f"topic {topic}: {got.get(topic, 0)}{total} messages complete{more}"


def _truncation(path: Path, exc: BaseException) -> BagError:
    """The BagError of a bag whose storage failed: the topic the damage cuts, where the files let it be named."""
    from .truncation import mcap_prefix

    expected = _expected_counts(path) if path.is_dir() else {}
    for file in _storage_files(path) if path.exists() else []:
        if file.suffix == ".mcap":  # walk it: the topic the end cuts, the messages left
            got, cut = mcap_prefix(file)
            return BagError(f"bag {path} is truncated or corrupt ({file.name}: {_one_line(exc)}); "
                            f"{_shortfall(expected, got, cut)}")
        if expected:  # a damaged sqlite3 file reads nothing: every topic of metadata.yaml is short
            return BagError(f"bag {path} is truncated or corrupt ({file.name}: {_one_line(exc)}); "
                            f"{_shortfall(expected, {})}")
    return BagError(f"bag {path} cannot be read: {_one_line(exc)}")


class BagReader:
    """An open bag: `topics` (topic -> (type, message count)), `require`, `messages`. Use as a context manager."""

    def __init__(self, path, store=None):
        from rosbags.rosbag2 import Reader

        self.path = Path(path)
        if not self.path.exists():
            raise BagError(f"bag {self.path} not found (expected a rosbag2 directory, or an .mcap or .db3 file)")
        self.store = store or typestore()
        try:
            self._reader = Reader(self.path)
            self._reader.open()
        except Exception as exc:  # noqa: BLE001 - rosbags, YAML, sqlite and OS errors of a damaged bag alike
            raise _truncation(self.path, exc) from None
        self.topics = {c.topic: (c.msgtype, int(c.msgcount)) for c in self._reader.connections}
        # metadata.yaml's custom_data (`record` notes its route and driver there); none in a bare storage file
        self.custom = dict(getattr(self._reader.storage.metadata, "custom", None) or {})

    def __enter__(self) -> "BagReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def require(self, topic: str, types: Iterable[str], optional: bool = False) -> Optional[str]:
        """The type of `topic`, which must be one of `types` (and known to the typestore); None when an optional
        topic is absent. A BagError names the topic otherwise."""
        types = tuple(types)
        if topic not in self.topics:
            if optional:
                return None
            have = ", ".join(f"{t} ({m})" for t, (m, _) in sorted(self.topics.items())) or "none"
            raise BagError(f"bag {self.path} has no topic {topic} (expected {' or '.join(types)}); its topics: {have}")
        msgtype = self.topics[topic][0]
        if msgtype not in types:
            raise BagError(f"bag {self.path}: topic {topic} has type {msgtype}; expected {' or '.join(types)}")
        if msgtype not in self.store.types:
            raise BagError(f"bag {self.path}: topic {topic} has type {msgtype}, unknown to the typestore")
        return msgtype

    def raw_messages(self, topics: Iterable[str]) -> Iterator[tuple[str, str, int, bytes]]:
        """(topic, type, receive ns, CDR bytes) of `topics` in receive order. A storage that fails mid-way is a
        BagError naming the first topic short of the messages metadata.yaml promises."""
        wanted = set(topics)
        conns = [c for c in self._reader.connections if c.topic in wanted]
        got: dict[str, int] = {}
        raw = self._reader.messages(connections=conns) if conns else iter(())
        while True:
            try:
                conn, log_ns, data = next(raw)
            except StopIteration:
                return
            except Exception as exc:  # noqa: BLE001 - the storage failed mid-way (sqlite pages, chunk CRC, ...)
                expected = {t: n for t, (_, n) in self.topics.items() if t in wanted}
                raise BagError(f"bag {self.path} is truncated or corrupt ({_one_line(exc)}); "
                               f"{_shortfall(expected, got)}") from None
            got[conn.topic] = got.get(conn.topic, 0) + 1
            yield conn.topic, conn.msgtype, int(log_ns), data

    def messages(self, topics: Iterable[str], last: Iterable[str] = ()) -> Iterator[BagMessage]:
        """Messages of `topics`, deserialized, in receive order; at equal receive times those of `last` (the
        cameras) come after the others, as the planner takes its inputs. A BagError names the topic of a message
        that does not deserialize, or of a storage that ends early."""
        last = set(last)
        got: dict[str, int] = {}
        pending: list[BagMessage] = []
        for topic, msgtype, log_ns, data in self.raw_messages(topics):
            got[topic] = got.get(topic, 0) + 1
            try:
                msg = self.store.deserialize_cdr(data, msgtype)
            except Exception as exc:  # noqa: BLE001 - rosbags raises several kinds for cut or foreign data
                raise BagError(f"bag {self.path}: message {got[topic]} on topic {topic} ({msgtype}) does not "
                               f"deserialize: {_one_line(exc)}") from None
            message = BagMessage(topic, msgtype, log_ns, msg)
            if pending and pending[0].log_ns != log_ns:
                yield from sorted(pending, key=lambda m: m.topic in last)  # stable: bag order otherwise
                pending = []
            pending.append(message)
        yield from sorted(pending, key=lambda m: m.topic in last)
