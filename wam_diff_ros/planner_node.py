"""WAM-Diff planner: a ROS 2 lifecycle node, camera images in; trajectory, detections and answers out.

Lifecycle (the yolo_ros shape):
  configure  read parameters, create publishers and the AskQuestion service
  activate   load the policy, start the planning thread, subscribe cameras / odometry / command
  deactivate unsubscribe, stop the planning thread, free the policy
  cleanup    destroy publishers and the service
Parameters are read on configure; change them and reconfigure (deactivate, cleanup, configure).

Inputs : camera_topics (sensor_msgs/Image, or CompressedImage when the topic ends in "/compressed";
         best-effort, depth 1), odometry_topic (nav_msgs/Odometry), command_topic (std_msgs/String,
         one of wam_diff_core.constants.NAV_COMMANDS), route_target_topic (geometry_msgs/PointStamped:
         the route target point, x, y in base_frame_id; used for a frame set whose stamp is within
         route_target_max_age_s of its own).
Outputs: trajectory (wam_diff_msgs/Trajectory), path (nav_msgs/Path), detections
         (wam_diff_msgs/Detection2DArray), markers (visualization_msgs/MarkerArray), answer
         (wam_diff_msgs/DrivingAnswer), /diagnostics (diagnostic_msgs/DiagnosticArray);
         service ask (wam_diff_msgs/srv/AskQuestion). Every output header carries the input stamp.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import PointStamped
from nav_msgs.msg import Odometry, Path
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.impl.implementation_singleton import rclpy_implementation  # RCLError lives here
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header, String
from builtin_interfaces.msg import Time
from visualization_msgs.msg import MarkerArray

from wam_diff_core.console import console_main
from wam_diff_core.errors import WamDiffError
from wam_diff_core.constants import (ATTENTION_BACKENDS, NAV_COMMANDS, ROUTE_TARGET_AHEAD_M, SCHEDULES, SHIPPED_MODEL,
                                     STRATEGIES, TASKS, TEXT_LAYERS)
from wam_diff_core.types import EgoState, Plan, check_command
from wam_diff_msgs.msg import Detection2DArray, DrivingAnswer, Trajectory
from wam_diff_msgs.srv import AskQuestion

from .camera_sync import ApproximateTimeSync, FrameSet, StampedFrame
from .image_conversion import MAX_PIXELS, MAX_SIDE_PX, ImageLimits, compressed_msg_to_rgb, image_msg_to_rgb
from .input_checks import command_text, odometry_sample, question_text, route_target, stamp_ns
from .plan_messages import (detections_msg, diagnostics_msg, marker_array_msg, path_msg, trajectory_msg)
from .planner_stats import PlannerStats
from .planning_worker import PlanningWorker

NODE_NAME = "wam_diff_planner"
# a flood of bad input: at most one log line and one immediate ERROR diagnostic per period (every one is counted)
ERROR_LOG_PERIOD_S = 1.0
ERROR_DIAGNOSTICS_PERIOD_S = 0.2

# Tasks answered on every frame set; QA is asked through the AskQuestion service instead.
PLAN_TASKS = tuple(t for t in TASKS if t != "qa")

# name -> (default, description). Types follow the defaults.
PARAMETERS = {
    "model": (SHIPPED_MODEL, f"'{SHIPPED_MODEL}' (the shipped model, models/{SHIPPED_MODEL}; the untrained 'nano' preset "
                             f"with a warning where it is absent), a preset name or a local checkpoint directory; "
                             f"'fake' = no model (wiring tests)"),
    "device": ("cpu", "torch device: cpu, cuda, cuda:0, ..."),
    "attention_backend": ("sdpa", f"attention backend, one of {list(ATTENTION_BACKENDS)} (flashinfer: GPU)"),
    "cuda_graphs": (False, "capture the block decode step as a CUDA graph (GPU only)"),
    "text_layers": ("model", f"text layers, one of {list(TEXT_LAYERS)}: the model's own, 'fast' (merged "
                             f"projections, same math) or 'compiled' (fast + torch.compile); the fastest measured "
                             f"on a GPU: compiled + cuda_graphs"),
    "block_size": (0, "B: tokens denoised in parallel per block (1 = autoregressive; 0 = the checkpoint's own)"),
    "denoising_steps": (0, "K: denoising steps per block (0 = the checkpoint's own)"),
    "remasking_strategy": ("", f"one of {list(STRATEGIES)} ('' = the checkpoint's own)"),
    "remasking_threshold": (0.0, "confidence threshold of low_confidence_dynamic, in (0, 1] (0 = the checkpoint's own)"),
    "commit_schedule": ("", f"positions committed per denoising step, one of {list(SCHEDULES)} ('' = the "
                            f"checkpoint's own; wam_diff_core/decoding/remasking.py)"),
    "max_new_tokens": (0, "token budget per answer; 0 = the model's default"),
    "kinematic_envelope": (True, "decode plans inside the kinematic envelope (wam_diff_core/decoding/envelope.py; "
                                 "eager decoding only, not the CUDA-graph path)"),
    "forward_only": ("", "the envelope also keeps plans from stepping back along the ego's heading: on, off, or '' "
                         "(the checkpoint's own)"),
    "tasks": (["planning"], f"tasks run on every frame set, subset of {list(PLAN_TASKS)}"),
    "camera_topics": (["/camera/image_raw"], "camera topics in prompt order; '/compressed' suffix = CompressedImage"),
    "image_reliability": ("best_effort", "camera QoS reliability: best_effort or reliable (depth is always 1)"),
    "max_image_bytes": (ImageLimits.max_bytes, "largest CompressedImage accepted, bytes; a larger one is rejected "
                                               "before decoding"),
    "max_image_side": (ImageLimits.max_side, f"largest width or height of a camera frame, pixels (1..{MAX_SIDE_PX}); "
                                             f"checked from a raw Image's fields or a compressed image's header, "
                                             f"before decoding"),
    "max_image_pixels": (ImageLimits.max_pixels, f"largest width x height of a camera frame (1..{MAX_PIXELS}, "
                                                 f"Pillow's decompression-bomb threshold); checked before decoding"),
    "sync_slop_s": (0.05, "largest stamp spread accepted between matched cameras, seconds"),
    "odometry_topic": ("/odom", "nav_msgs/Odometry of the ego vehicle (twist in the ego frame)"),
    "command_topic": ("command", "std_msgs/String navigation command"),
    "default_command": ("follow lane", f"command used until one arrives; one of {list(NAV_COMMANDS)}"),
    "route_target_topic": ("route_target", f"geometry_msgs/PointStamped route target point: the route "
                                           f"{ROUTE_TARGET_AHEAD_M:g} m ahead along the route, x, y in base_frame_id "
                                           f"(z ignored)"),
    "route_target_max_age_s": (0.5, "a route target is used for a frame set only when their stamps differ by at "
                                     "most this many seconds; otherwise the plan has no target"),
    "rate_hz": (10.0, "most plans per second; the node plans on the newest frame set when free (0 = no cap)"),
    "base_frame_id": ("base_link", "frame of trajectory, path and markers (ego: x forward, y left)"),
    "diagnostics_period_s": (1.0, "period of the /diagnostics status, seconds"),
    "ask_timeout_s": (30.0, "longest AskQuestion waits for the model, seconds"),
    "warmup": (True, "run one plan on a blank image on activate so the first frame is not slow"),
    "autostart": (False, "configure and activate on start (console scripts, launch without a lifecycle manager)"),
}


@dataclass(frozen=True)
class PolicySettings:
    """The parameters that define the loaded policy, as ROS declares them: 0 and "" mean unset (the
    checkpoint's own, its wam_diff.json; for max_new_tokens the policy's per-task budget)."""

    model: str = SHIPPED_MODEL
    device: str = "cpu"
    attention_backend: str = "sdpa"
    cuda_graphs: bool = False
    block_size: int = 0
    denoising_steps: int = 0
    remasking_strategy: str = ""
    remasking_threshold: float = 0.0
    max_new_tokens: int = 0
    tasks: tuple[str, ...] = ("planning",)
    kinematic_envelope: bool = True
    commit_schedule: str = ""
    forward_only: str = ""  # "on", "off"
    text_layers: str = "model"


def load_policy(settings: PolicySettings):
    """Create the policy for `settings`: the checkpoint's own decoding settings with the parameters that are set
    on top (0 / "" become None, unset, here and nowhere else). The core engine is imported here, lazily, so the
    node starts fast and tests can inject a fake through PlannerNode(policy_factory=...)."""
    if settings.model == "fake":
        from .fake_policy import FakePolicy

        return FakePolicy(tasks=settings.tasks)
    from wam_diff_core.policy import DrivingPolicy

    s = settings
    return DrivingPolicy.load(
        s.model, device=s.device, tasks=s.tasks, block_size=s.block_size or None, steps=s.denoising_steps or None,
        strategy=s.remasking_strategy or None, threshold=s.remasking_threshold or None,
        schedule=s.commit_schedule or None, forward_only={"on": True, "off": False}.get(s.forward_only),
        max_new_tokens=s.max_new_tokens or None, backend=s.attention_backend, cuda_graphs=s.cuda_graphs,
        kinematic_envelope=s.kinematic_envelope, text_layers=s.text_layers)


def ns_to_stamp(ns: int) -> Time:
    return Time(sec=int(ns // 1_000_000_000), nanosec=int(ns % 1_000_000_000))


def _close_policy(policy) -> None:
    try:
        policy.close()
    except Exception as exc:  # noqa: BLE001 - freeing must not fail a transition
        print(f"{NODE_NAME}: policy.close() failed: {exc}", file=sys.stderr)


class PlannerNode(LifecycleNode):
    """Lifecycle node running DrivingPolicy on the newest matched camera frame set."""

    def __init__(self, node_name: str = NODE_NAME, *, policy_factory: Optional[Callable] = None, **kwargs):
        super().__init__(node_name, **kwargs)
        self._policy_factory = policy_factory or load_policy
        for name, (default, description) in PARAMETERS.items():
            self.declare_parameter(name, default, ParameterDescriptor(description=description))
        self.stats = PlannerStats()
        self.policy = None
        self._worker: Optional[PlanningWorker] = None
        self._sync: Optional[ApproximateTimeSync] = None
        self._pubs: dict = {}
        self._subs: list = []
        self._service = None
        self._diag_timer = None
        self._latest: Optional[tuple[FrameSet, float]] = None
        self._odom_lock = threading.Lock()
        self._ego = EgoState(0.0)
        self._last_odom: Optional[tuple[float, float, float]] = None  # (t, vx, vy)
        self._odom_seen = False
        self._command = "follow lane"
        self._route_target: Optional[tuple[int, tuple[float, float]]] = None  # (stamp ns, (x, y) m ego frame)
        self._sensor_group = MutuallyExclusiveCallbackGroup()
        self._service_group = MutuallyExclusiveCallbackGroup()
        self._cfg: dict = {}
        self._trained_frame: Optional[tuple[int, int]] = None  # (W, H) the model learned from, when it says
        self._frame_sizes: dict[int, tuple[int, int]] = {}  # camera index -> (W, H) of its newest frame
        self._last_error_report = {"log": -math.inf, "diagnostics": -math.inf}  # monotonic s of the last of each

    # ------------------------------------------------------------------ lifecycle

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            self._cfg = self._read_parameters()
        except ValueError as exc:
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        self._command = self._cfg["default_command"]
        self._pubs = {
            "trajectory": self.create_publisher(Trajectory, "trajectory", 10),
            "path": self.create_publisher(Path, "path", 10),
            "detections": self.create_publisher(Detection2DArray, "detections", 10),
            "markers": self.create_publisher(MarkerArray, "markers", 10),
            "answer": self.create_publisher(DrivingAnswer, "answer", 10),
            "diagnostics": self.create_publisher(DiagnosticArray, "/diagnostics", 10),
        }
        self._service = self.create_service(AskQuestion, "ask", self._on_ask, callback_group=self._service_group)
        self.get_logger().info(
            f"configured: model={self._cfg['model']} device={self._cfg['device']} cameras={self._cfg['camera_topics']}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        cfg = self._cfg
        t0 = time.perf_counter()
        try:
            self.policy = self._policy_factory(cfg["policy"])
        except Exception as exc:  # noqa: BLE001 - a failed load is a failed transition, not a crash
            self._report_error(f"loading model {cfg['model']!r} failed: {type(exc).__name__}: {exc}")
            return TransitionCallbackReturn.FAILURE
        load_s = time.perf_counter() - t0
        self._trained_frame = getattr(self.policy, "trained_frame_size", None)
        self._frame_sizes = {}
        if cfg["warmup"]:
            self._warmup()
        self.stats.reset()
        self._latest = None
        self._sync = ApproximateTimeSync(len(cfg["camera_topics"]), cfg["sync_slop_s"])
        min_period = 1.0 / cfg["rate_hz"] if cfg["rate_hz"] > 0 else 0.0
        self._worker = PlanningWorker(self._plan, self._ask, self._report_error, min_period, name="wam_diff_planning")
        self._worker.start()
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, durability=DurabilityPolicy.VOLATILE,
                         reliability=cfg["image_reliability"])
        # odometry, command and route target first: when they and a frame are ready together, the executor
        # takes them in creation order, so the plan uses the ego state (and target) published with the frame
        odom_qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.BEST_EFFORT)
        self._subs.append(self.create_subscription(Odometry, cfg["odometry_topic"], self._on_odometry, odom_qos,
                                                   callback_group=self._sensor_group))
        self._subs.append(self.create_subscription(String, cfg["command_topic"], self._on_command, 10,
                                                   callback_group=self._sensor_group))
        self._subs.append(self.create_subscription(PointStamped, cfg["route_target_topic"], self._on_route_target,
                                                   10, callback_group=self._sensor_group))
        for index, topic in enumerate(cfg["camera_topics"]):
            compressed = topic.rstrip("/").endswith("/compressed")
            msg_type = CompressedImage if compressed else Image
            self._subs.append(self.create_subscription(
                msg_type, topic, lambda msg, i=index, c=compressed: self._on_image(msg, i, c), qos,
                callback_group=self._sensor_group))
        self._diag_timer = self.create_timer(cfg["diagnostics_period_s"], self.publish_diagnostics)
        self.get_logger().info(f"active: policy loaded in {load_s:.2f} s")
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_running()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._destroy_interfaces()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_running()
        self._destroy_interfaces()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_running()
        return TransitionCallbackReturn.SUCCESS

    def release(self, timeout_s: float = 1.0) -> None:
        """Stop planning and free the model without any ROS call (safe after the context shut down)."""
        worker, self._worker = self._worker, None
        policy, self.policy = self.policy, None
        stopped = worker.stop(timeout_s) if worker is not None else True
        if policy is None:
            return
        if stopped:
            _close_policy(policy)
        else:  # a plan is still running: free the model once it returns, without blocking shutdown
            threading.Thread(target=lambda: (worker.join(), _close_policy(policy)), daemon=True).start()

    def _stop_running(self) -> None:
        for sub in self._subs:
            self.destroy_subscription(sub)
        self._subs = []
        if self._diag_timer is not None:
            self.destroy_timer(self._diag_timer)
            self._diag_timer = None
        self.release()
        self._latest = None
        self._route_target = None

    def _destroy_interfaces(self) -> None:
        for pub in self._pubs.values():
            self.destroy_publisher(pub)
        self._pubs = {}
        if self._service is not None:
            self.destroy_service(self._service)
            self._service = None

    # ------------------------------------------------------------------ parameters

    def _read_parameters(self) -> dict:
        p = {name: self.get_parameter(name).value for name in PARAMETERS}
        p["camera_topics"] = [str(t) for t in (p["camera_topics"] or [])]
        if not p["camera_topics"] or any(not t for t in p["camera_topics"]):
            raise ValueError(f"camera_topics must be a non-empty list of topic names, got {p['camera_topics']}")
        p["tasks"] = tuple(str(t) for t in (p["tasks"] or []))
        if not p["tasks"] or any(t not in PLAN_TASKS for t in p["tasks"]):
            raise ValueError(f"tasks must be a non-empty subset of {list(PLAN_TASKS)}, got {list(p['tasks'])}")
        reliability = {"best_effort": ReliabilityPolicy.BEST_EFFORT, "reliable": ReliabilityPolicy.RELIABLE}
        if p["image_reliability"] not in reliability:
            raise ValueError(f"image_reliability must be one of {list(reliability)}, got {p['image_reliability']!r}")
        p["image_reliability"] = reliability[p["image_reliability"]]
        p["image_limits"] = ImageLimits(p["max_image_bytes"], p["max_image_side"], p["max_image_pixels"])
        p["default_command"] = check_command(p["default_command"])
        for name in ("block_size", "denoising_steps"):
            if int(p[name]) < 0:
                raise ValueError(f"{name} must be >= 1, or 0 for the checkpoint's own, got {p[name]}")
        for name in ("diagnostics_period_s", "ask_timeout_s"):
            if not float(p[name]) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {p[name]}")
        if float(p["sync_slop_s"]) < 0 or float(p["rate_hz"]) < 0:
            raise ValueError(f"sync_slop_s and rate_hz must be >= 0, got {p['sync_slop_s']}, {p['rate_hz']}")
        if not float(p["route_target_max_age_s"]) >= 0:
            raise ValueError(f"route_target_max_age_s must be >= 0 seconds, got {p['route_target_max_age_s']}")
        p["route_target_max_age_s"] = float(p["route_target_max_age_s"])
        if str(p["commit_schedule"]) not in ("",) + SCHEDULES:
            raise ValueError(f"commit_schedule must be one of {list(SCHEDULES)} or '' (the checkpoint's own), "
                             f"got {p['commit_schedule']!r}")
        if str(p["forward_only"]) not in ("", "on", "off"):
            raise ValueError(f"forward_only must be 'on', 'off' or '' (the checkpoint's own), got {p['forward_only']!r}")
        if str(p["text_layers"]) not in TEXT_LAYERS:
            raise ValueError(f"text_layers must be one of {list(TEXT_LAYERS)}, got {p['text_layers']!r}")
        if not str(p["route_target_topic"]):
            raise ValueError("route_target_topic must be a topic name, got ''")
        p["policy"] = PolicySettings(
            model=str(p["model"]), device=str(p["device"]), attention_backend=str(p["attention_backend"]),
            cuda_graphs=bool(p["cuda_graphs"]), block_size=int(p["block_size"]),
            denoising_steps=int(p["denoising_steps"]), remasking_strategy=str(p["remasking_strategy"]),
            remasking_threshold=float(p["remasking_threshold"]), max_new_tokens=int(p["max_new_tokens"]),
            tasks=p["tasks"], kinematic_envelope=bool(p["kinematic_envelope"]),
            commit_schedule=str(p["commit_schedule"]), forward_only=str(p["forward_only"]),
            text_layers=str(p["text_layers"]))
        return p

    # ------------------------------------------------------------------ inputs (executor threads)
    # Each input is checked before anything uses it (image_conversion.py, input_checks.py). A rejected message is
    # counted and reported as an ERROR; so is anything else a callback raises, which would otherwise end the
    # executor's spin and with it the node.

    def _reject(self, counter: str, what: str, exc: Exception) -> str:
        """Count a rejected input in `counter`, report it as an ERROR; returns the text."""
        self.stats.count(counter)
        reason = str(exc) if isinstance(exc, WamDiffError) else f"{type(exc).__name__}: {str(exc)[:200]}"
        text = f"rejected {what}: {reason}"
        self._report_error(text)
        return text

    def _on_image(self, msg, camera: int, compressed: bool) -> None:
        received = time.monotonic()
        self.stats.count("frames_received")
        worker, sync = self._worker, self._sync
        if worker is None or sync is None:
            return
        try:
            stamp = stamp_ns(msg.header.stamp, "image")
            limits = self._cfg["image_limits"]
            rgb = compressed_msg_to_rgb(msg, limits) if compressed else image_msg_to_rgb(msg, limits)
        except Exception as exc:  # noqa: BLE001 - see above
            self._reject("frames_rejected", f"frame on {self._cfg['camera_topics'][camera]}", exc)
            return
        self._check_frame_size(rgb, camera)
        frame_set = sync.add(camera, StampedFrame(stamp, rgb, msg.header.frame_id))
        self.stats.set_count("frames_unmatched", sync.unmatched)
        self.stats.set_count("sync_resets", sync.resets)
        if frame_set is None:
            return
        self._latest = (frame_set, received)
        if worker.submit((frame_set, received)):
            self.stats.count("frames_dropped")  # replaced a set the worker never took

    def _check_frame_size(self, rgb, camera: int) -> None:
        """Count (and log, throttled) frames of another size than the model's trained frames: it still plans, but
        from a view it never saw (the diagnostics say WARN)."""
        size = (int(rgb.shape[1]), int(rgb.shape[0]))
        self._frame_sizes[camera] = size
        trained = self._trained_frame
        if trained is not None and size != trained:
            self.stats.count("frames_off_size")
            self.get_logger().warning(self._off_size_text(size, camera), throttle_duration_sec=10.0)

    def _off_size_text(self, size: tuple[int, int], camera: int) -> str:
        t = self._trained_frame
        return (f"camera frames on {self._cfg['camera_topics'][camera]} are {size[0]}x{size[1]}, the model was trained "
                f"on {t[0]}x{t[1]} frames")

    def _on_odometry(self, msg: Odometry) -> None:
        try:
            sample = odometry_sample(msg)
            t, vx, vy = sample.stamp_ns * 1e-9, sample.vx, sample.vy
            with self._odom_lock:
                ax = ay = 0.0
                if self._last_odom is not None:
                    dt = t - self._last_odom[0]
                    if 1e-3 < dt < 1.0:  # finite differences only between close, ordered samples
                        ax, ay = (vx - self._last_odom[1]) / dt, (vy - self._last_odom[2]) / dt
                self._ego = EgoState(vx, vy, ax, ay, sample.yaw_rate)
                self._last_odom = (t, vx, vy)
                self._odom_seen = True
        except Exception as exc:  # noqa: BLE001 - see above
            self._reject("odometry_rejected", f"odometry on {self._cfg['odometry_topic']}", exc)

    def _on_command(self, msg: String) -> None:
        try:
            self._command = command_text(msg.data)
        except Exception as exc:  # noqa: BLE001 - see above
            self._reject("commands_rejected", f"command on {self._cfg['command_topic']}", exc)

    def _on_route_target(self, msg: PointStamped) -> None:
        try:
            self._route_target = route_target(msg, self._cfg["base_frame_id"])
        except Exception as exc:  # noqa: BLE001 - see above
            self._reject("route_targets_rejected", f"route target on {self._cfg['route_target_topic']}", exc)

    def _target_for(self, stamp_ns: int) -> Optional[tuple[float, float]]:
        """The newest route target when its stamp is within route_target_max_age_s of `stamp_ns`, else None
        (a route that stops publishing targets plans without one)."""
        latest = self._route_target
        if latest is None:
            return None
        target_ns, target = latest
        return target if abs(stamp_ns - target_ns) <= self._cfg["route_target_max_age_s"] * 1e9 else None

    def _on_ask(self, request: AskQuestion.Request, response: AskQuestion.Response) -> AskQuestion.Response:
        worker, latest = self._worker, self._latest
        if worker is None:
            response.success, response.message = False, "planner is not active (activate it first)"
            return response
        try:
            question = question_text(request.question)
        except Exception as exc:  # noqa: BLE001 - see the inputs above
            response.success, response.message = False, self._reject("questions_rejected", "question", exc)
            return response
        if latest is None:
            response.success, response.message = False, "no camera frame set received yet"
            return response
        frame_set = latest[0]
        try:
            answer, latency_s = worker.ask((question, frame_set)).result(timeout=self._cfg["ask_timeout_s"])
        except Exception as exc:  # noqa: BLE001 - bad question, model failure or timeout -> a failed response
            response.success, response.message = False, f"{type(exc).__name__}: {exc}"
            return response
        response.success, response.answer = True, answer.text
        response.stamp, response.latency_s = ns_to_stamp(frame_set.stamp_ns), float(latency_s)
        return response

    # ------------------------------------------------------------------ policy calls (planning thread)

    def _warmup(self) -> None:
        import numpy as np

        blank = [np.full((224, 224, 3), 128, np.uint8)] * len(self._cfg["camera_topics"])
        try:
            self.policy.plan(blank, EgoState(0.0), self._command, tasks=self._cfg["tasks"])
        except Exception as exc:  # noqa: BLE001
            self.get_logger().warning(f"warm-up plan failed: {type(exc).__name__}: {exc}")

    def _plan(self, job: tuple[FrameSet, float]) -> None:
        frame_set, received = job
        with self._odom_lock:
            ego = self._ego
        command, cfg, policy = self._command, self._cfg, self.policy
        if policy is None:
            return
        target = self._target_for(frame_set.stamp_ns)
        t0 = time.perf_counter()
        failed = False
        try:
            plan = policy.plan([f.frame for f in frame_set.frames], ego, command, tasks=cfg["tasks"], target=target)
        except Exception as exc:  # noqa: BLE001 - bad inputs for the model must not end planning
            # still answer the frame (an invalid Trajectory naming the error): closed loops wait for it
            failed = True
            text = f"policy.plan failed: {type(exc).__name__}: {exc}"
            self.stats.count("plan_errors")
            self._report_error(text)
            plan = Plan(trajectory=None, valid=False, errors={"policy": text})
        policy_s = time.perf_counter() - t0
        if self.policy is not policy:
            return  # deactivated while planning: publish nothing
        stamp = ns_to_stamp(frame_set.stamp_ns)
        ego_header = Header(stamp=stamp, frame_id=cfg["base_frame_id"])
        pubs = self._pubs
        decoding = getattr(policy, "config", None)  # the policy's effective B and K (parameters 0: its checkpoint's)
        pubs["trajectory"].publish(trajectory_msg(plan, ego_header, command,
                                                  getattr(decoding, "block_size", cfg["block_size"]),
                                                  getattr(decoding, "steps", cfg["denoising_steps"]), policy_s))
        pubs["path"].publish(path_msg(plan, ego_header))
        pubs["markers"].publish(marker_array_msg(plan, ego_header))
        if "detection" in cfg["tasks"]:
            camera_header = Header(stamp=stamp, frame_id=frame_set.frames[0].frame_id)
            pubs["detections"].publish(detections_msg(plan.detections, camera_header))
        if failed:
            return
        stamp_age_s = (self.get_clock().now().nanoseconds - frame_set.stamp_ns) * 1e-9
        if target is not None:
            self.stats.count("plans_with_route_target")
        self.stats.plan_done(time.monotonic() - received, policy_s, stamp_age_s, plan.valid)

    def _ask(self, job: tuple[str, FrameSet]):
        question, frame_set = job
        policy = self.policy
        if policy is None:
            raise RuntimeError("planner was deactivated before answering")
        t0 = time.perf_counter()
        answer = policy.ask([f.frame for f in frame_set.frames], question)
        latency_s = time.perf_counter() - t0
        self.stats.count("questions_answered")
        msg = DrivingAnswer(header=Header(stamp=ns_to_stamp(frame_set.stamp_ns), frame_id=frame_set.frames[0].frame_id),
                            question=question, answer=answer.text, latency_s=float(latency_s))
        pub = self._pubs.get("answer")
        if pub is not None:
            pub.publish(msg)
        return answer, latency_s

    # ------------------------------------------------------------------ diagnostics

    def _report_error(self, text: str) -> None:
        """Record an error (counted at once); log it at most once per ERROR_LOG_PERIOD_S and publish an ERROR
        diagnostic at most once per ERROR_DIAGNOSTICS_PERIOD_S (the periodic diagnostics carry the rest), so a
        flood of bad messages costs each one a counter update, not a log line and a /diagnostics message."""
        self.stats.error(text)
        now = time.monotonic()
        if now - self._last_error_report["log"] >= ERROR_LOG_PERIOD_S:
            self._last_error_report["log"] = now
            self.get_logger().error(text)
        if now - self._last_error_report["diagnostics"] >= ERROR_DIAGNOSTICS_PERIOD_S:
            self._last_error_report["diagnostics"] = now
            self.publish_diagnostics()

    def publish_diagnostics(self) -> None:
        pub = self._pubs.get("diagnostics")
        if pub is None:
            return
        values = self.stats.snapshot()
        sizes = sorted(dict(self._frame_sizes).items())  # one snapshot: camera callbacks may add a camera meanwhile
        values.update(model=self._cfg.get("model", ""), command=self._command,
                      odometry="received" if self._odom_seen else "none yet (ego speed 0)",
                      model_uses_route_target=str(getattr(self.policy, "uses_route_target", "unknown")).lower(),
                      trained_frame_size="x".join(map(str, self._trained_frame)) if self._trained_frame else "unknown",
                      frame_size=",".join("x".join(map(str, v)) for _, v in sizes) or "none yet")
        off_size = [(c, v) for c, v in sizes if self._trained_frame is not None and v != self._trained_frame]
        if self.stats.in_error:
            level, message = DiagnosticStatus.ERROR, values["last_error"]
        elif self.policy is None:
            level, message = DiagnosticStatus.WARN, "inactive: no model loaded"
        elif values["plans_published"] == "0":
            level, message = DiagnosticStatus.WARN, "waiting for camera frames"
        elif off_size:
            level, message = DiagnosticStatus.WARN, "planning; " + self._off_size_text(off_size[0][1], off_size[0][0])
        else:
            level, message = DiagnosticStatus.OK, "planning"
        try:
            pub.publish(diagnostics_msg(self.get_clock().now().to_msg(), f"{self.get_fully_qualified_name()}: planner",
                                        self._cfg.get("device", ""), level, message, values))
        except Exception:  # noqa: BLE001 - publisher destroyed during shutdown
            pass


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _stop_on_signals() -> Callable[..., None]:
    """Make SIGINT and SIGTERM both end `executor.spin()` with one KeyboardInterrupt; later signals do nothing.

    Installed before rclpy.init, these are the handlers rclpy's own call after shutting the context down. Without
    one for SIGTERM the executor only meets the shut-down context (an RCLError traceback, exit status 1). Returns
    the function that makes further signals no-ops and, at the end, puts the previous handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda restore=False: None  # signal handlers can only be set from the main thread
    stopping = threading.Event()

    def on_signal(signum, frame):
        if not stopping.is_set():
            stopping.set()
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}

    def stop(restore: bool = False) -> None:
        stopping.set()
        if restore:
            for s, handler in previous.items():
                signal.signal(s, handler)

    return stop


@console_main("wam-diff-planner")
def main(argv: Optional[list[str]] = None, policy_factory: Optional[Callable] = None, exit_fast: bool = True) -> int:
    """Console script `wam-diff-planner`: run the node; `-p autostart:=true` configures and activates it.

    SIGINT and SIGTERM (Ctrl-C, `kill`, `ros2 launch` stopping it) end it with exit status 0, also with a plan in
    flight: the planning thread gets 0.5 s to finish, then the model is freed in the background. After the
    orderly shutdown (node destroyed, context shut down) the process ends with os._exit when `exit_fast`:
    interpreter teardown with torch + transformers imported takes 0.7-1.5 s on a 2-core machine, which would
    break the "a signal stops the node within 2 s" promise."""
    stop = _stop_on_signals()
    rclpy.init(args=argv if argv is not None else sys.argv)
    node = PlannerNode(policy_factory=policy_factory)
    executor = MultiThreadedExecutor(num_threads=3)
    executor.add_node(node)
    try:  # a signal may come at any moment, also during autostart
        if node.get_parameter("autostart").value:
            if node.trigger_configure() != TransitionCallbackReturn.SUCCESS or \
                    node.trigger_activate() != TransitionCallbackReturn.SUCCESS:
                node.get_logger().error("autostart failed; staying in the reached lifecycle state")
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except rclpy_implementation.RCLError:
        if rclpy.ok():
            raise
        # the signal shut the context down while the executor was building its wait set
    finally:
        stop()  # a second signal must not cut the cleanup short with a traceback
        node.release(timeout_s=0.5)
        executor.shutdown(timeout_sec=0.5)
        node.destroy_node()
        rclpy.try_shutdown()
    if exit_fast:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    stop(restore=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
