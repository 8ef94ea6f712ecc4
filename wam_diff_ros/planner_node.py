"""WAM-Diff planner: a ROS 2 lifecycle node, camera images in; trajectory, detections and answers out.

Lifecycle (the yolo_ros shape; docs/ros.md):
  configure  check the parameters, create the lifecycle publishers and the AskQuestion service
  activate   load the policy (and warm it up), start the planning thread, subscribe cameras / odometry / command
  deactivate unsubscribe, stop the planning thread, free the policy, clear the markers (one DELETEALL)
  cleanup    destroy the publishers and the service
  on error   as deactivate + cleanup, from wherever it happened: the next configure starts from nothing
A transition that raises logs one line naming it and the exception, and returns FAILURE for a cause the user can
fix (a bad parameter, a model that does not load) or ERROR (lifecycle_transitions.py). The lifecycle services run
in their own reentrant callback group and transitions never overlap, so on a MultiThreadedExecutor (what
`wam-diff-planner` spins) get_state, the parameter services and /diagnostics answer during a slow model load.
/diagnostics is published in every state, every `diagnostics_period_s`, by a plain publisher; the outputs are
lifecycle publishers (silent unless active). Parameters: planner_parameters.py (read-only ones are set at
start; runtime ones are checked by the on-set callback and applied at once).

Inputs : camera_topics (sensor_msgs/Image, or CompressedImage when the topic ends in "/compressed";
         best-effort, depth 1), odometry_topic (nav_msgs/Odometry), command_topic (std_msgs/String,
         one of wam_diff_core.constants.NAV_COMMANDS; transient local, so the last command published before the
         node subscribed arrives too), route_target_topic (geometry_msgs/PointStamped: the route target point, x,
         y in base_frame_id; used for a frame set whose stamp is within route_target_max_age_s of its own).
Outputs: trajectory (wam_diff_msgs/Trajectory), path (nav_msgs/Path), detections
         (wam_diff_msgs/Detection2DArray), markers (visualization_msgs/MarkerArray), answer
         (wam_diff_msgs/DrivingAnswer), /diagnostics (diagnostic_msgs/DiagnosticArray);
         service ask (wam_diff_msgs/srv/AskQuestion). Every output header carries the input stamp.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Callable, Optional

import rclpy
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import PointStamped
from nav_msgs.msg import Odometry, Path
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.executors import ExternalShutdownException
from rclpy.impl.implementation_singleton import rclpy_implementation  # RCLError lives here
from rclpy.lifecycle import LifecycleNode, LifecycleNodeMixin, LifecycleState, TransitionCallbackReturn
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Header, String
from visualization_msgs.msg import Marker, MarkerArray

from wam_diff_core.console import console_main, one_line
from wam_diff_core.errors import WamDiffError
from wam_diff_core.types import EgoState, Plan
from wam_diff_msgs.msg import Detection2DArray, DrivingAnswer, Trajectory
from wam_diff_msgs.srv import AskQuestion

from .camera_sync import ApproximateTimeSync, FrameSet, StampedFrame
from .ego_motion import EgoMotion
from .executor import ReadyOnceExecutor
from .image_conversion import compressed_msg_to_rgb, image_msg_to_rgb
from .input_checks import command_text, odometry_sample, question_text, route_target, stamp_ns
from .lifecycle_transitions import TransitionFailure, serialize_change_state, transition
from .plan_messages import detections_msg, diagnostics_msg, marker_array_msg, path_msg, trajectory_msg
from .planner_diagnostics import ERROR_LOG_PERIOD_S, INPUT_ERROR_KINDS, ErrorThrottle, hardware_id, planner_status
from .planner_parameters import (PARAMETERS, RUNTIME_PARAMETERS, ParameterError, as_declared_type,
                                 check_candidates_fit, check_value, descriptor, image_limits, read_config)
from .planner_stats import PlannerStats
from .planning_worker import PlanningWorker
from .policy_loading import PolicySettings, close_policy, load_policy  # noqa: F401 - PolicySettings: the node's API
from .topic_qos import COMMAND_QOS  # transient local: the bridges publish the command once, when it changes

NODE_NAME = "wam_diff_planner"
OUTPUTS = (("trajectory", Trajectory), ("path", Path), ("detections", Detection2DArray), ("markers", MarkerArray),
           ("answer", DrivingAnswer))
RELIABILITY = {"best_effort": ReliabilityPolicy.BEST_EFFORT, "reliable": ReliabilityPolicy.RELIABLE}


def ns_to_stamp(ns: int) -> Time:
    return Time(sec=int(ns // 1_000_000_000), nanosec=int(ns % 1_000_000_000))


def plan_period_s(rate_hz: float) -> float:
    return 1.0 / rate_hz if rate_hz > 0 else 0.0


CANDIDATE_PARAMETERS = frozenset({"candidates", "scorer", "candidate_sampling", "candidate_braking"})


def candidate_planner(policy, cfg: dict):
    """The CandidatePlanner the node plans through: `candidates` per frame set drawn by `candidate_sampling`, the
    published one picked by `scorer` ('' = none: candidate 0), braking plans added by `candidate_braking`;
    candidates 1 is the policy's own plan call."""
    from wam_diff_core.scoring.planner import CandidatePlanner  # the core engine loads with the policy

    return CandidatePlanner(policy, cfg["candidates"], cfg["scorer"] or None, cfg["candidate_sampling"],
                            where="a ROS node", braking=cfg["candidate_braking"])


class PlannerNode(LifecycleNode):
    """Lifecycle node running DrivingPolicy on the newest matched camera frame set."""

    def __init__(self, node_name: str = NODE_NAME, *, policy_factory: Optional[Callable] = None, **kwargs):
        # LifecycleNode.__init__ gives the lifecycle services the default callback group, which the parameter
        # services and the diagnostics timer share: one slow transition would block them all
        Node.__init__(self, node_name, **kwargs)
        self._lifecycle_group = ReentrantCallbackGroup()
        LifecycleNodeMixin.__init__(self, callback_group=self._lifecycle_group)
        self._transition_lock = threading.Lock()
        serialize_change_state(self, self._transition_lock)
        self._policy_factory = policy_factory or load_policy
        try:
            self._declare_parameters()
        except ParameterError:
            self.destroy_node()
            raise
        self.stats = PlannerStats()
        self.policy = None
        self._worker: Optional[PlanningWorker] = None
        self._sync: Optional[ApproximateTimeSync] = None
        self._pubs: dict = {}
        self._subs: list = []
        self._service = None
        self._latest: Optional[tuple[FrameSet, float]] = None
        self._planner = None  # the CandidatePlanner over the active policy (candidates, scorer, candidate_sampling)
        self._odom_lock = threading.Lock()
        self._ego_motion = EgoMotion()
        self._command = "follow lane"
        self._route_target: Optional[tuple[int, tuple[float, float]]] = None  # (stamp ns, (x, y) m ego frame)
        self._sensor_group = MutuallyExclusiveCallbackGroup()
        self._service_group = MutuallyExclusiveCallbackGroup()
        self._cfg: dict = {}
        self._apply_lock = threading.RLock()  # runtime parameter changes against activation
        self._output_lock = threading.Lock()  # a plan publishes whole, or not at all once deactivation began
        self._trained_frame: Optional[tuple[int, int]] = None  # (W, H) the model learned from, when it says
        self._frame_sizes: dict[int, tuple[int, int]] = {}  # camera index -> (W, H) of its newest frame
        self._model = self.get_parameter("model").value
        self._hardware_id = hardware_id(self._model, self.get_parameter("device").value)
        period_s = self.get_parameter("diagnostics_period_s").value
        self._log_throttle = ErrorThrottle(ERROR_LOG_PERIOD_S)
        self._reported_error_kind: Optional[str] = None  # the error kind of the last ERROR status published
        self._diagnostics_throttle = ErrorThrottle(period_s)
        self._diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._diagnostics_timer = self.create_timer(period_s, self.publish_diagnostics)
        self.add_pre_set_parameters_callback(lambda params: [as_declared_type(p) for p in params])
        self.add_on_set_parameters_callback(self._check_parameters)
        self.add_post_set_parameters_callback(self._apply_parameters)

    # ------------------------------------------------------------------ lifecycle

    def trigger_configure(self):
        with self._transition_lock:
            return super().trigger_configure()

    def trigger_activate(self):
        with self._transition_lock:
            return super().trigger_activate()

    def trigger_deactivate(self):
        with self._transition_lock:
            return super().trigger_deactivate()

    def trigger_cleanup(self):
        with self._transition_lock:
            return super().trigger_cleanup()

    def trigger_shutdown(self):
        with self._transition_lock:
            return super().trigger_shutdown()

    def autostart(self) -> bool:
        """Configure and activate (the `autostart` parameter); False, with a log line, when either fails."""
        ok = self.trigger_configure() == TransitionCallbackReturn.SUCCESS and \
            self.trigger_activate() == TransitionCallbackReturn.SUCCESS
        if not ok:
            self.get_logger().error("autostart failed; staying in the reached lifecycle state")
        return ok

    def schedule_autostart(self) -> None:
        """Run autostart() from the executor as soon as it spins, in the lifecycle services' callback group: on a
        MultiThreadedExecutor get_state, the parameters and /diagnostics answer during the model load."""

        def once():
            timer.cancel()
            self.autostart()

        timer = self.create_timer(0.0, once, callback_group=self._lifecycle_group)

    @transition("configure")
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._destroy_interfaces()  # a configure after an error starts from nothing
        cfg = read_config({name: self.get_parameter(name).value for name in PARAMETERS})
        with self._apply_lock:
            self._cfg = cfg
        self._command = cfg["default_command"]
        self._pubs = {topic: self.create_lifecycle_publisher(msg_type, topic, 10) for topic, msg_type in OUTPUTS}
        self._service = self.create_service(AskQuestion, "ask", self._on_ask, callback_group=self._service_group)
        self.stats.clear_error()
        self.get_logger().info(f"configured: model={cfg['model']} device={cfg['device']} "
                               f"cameras={list(cfg['camera_topics'])}")
        return TransitionCallbackReturn.SUCCESS

    @transition("activate")
    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_running()
        cfg = self._cfg
        t0 = time.perf_counter()
        policy = self._load_policy(cfg)
        load_s = time.perf_counter() - t0
        try:
            result = self._start_planning(policy, state)
        except BaseException:
            if self.policy is not policy:  # on_error frees the one it holds
                close_policy(policy, NODE_NAME)
            raise
        self.get_logger().info(f"active: policy loaded in {load_s:.2f} s")
        return result

    def _start_planning(self, policy, state: LifecycleState) -> TransitionCallbackReturn:
        with self._apply_lock:
            cfg = self._cfg  # with the runtime changes made during the load
            self.stats.reset()
            self._latest, self._frame_sizes = None, {}
            self._trained_frame = getattr(policy, "trained_frame_size", None)
            self._sync = ApproximateTimeSync(len(cfg["camera_topics"]), cfg["sync_slop_s"])
            self._worker = PlanningWorker(self._plan, self._ask, lambda text: self._report_error(text, "worker"),
                                          plan_period_s(cfg["rate_hz"]), name="wam_diff_planning")
            self._planner = candidate_planner(policy, cfg)
            self.policy = policy
        self._worker.start()
        result = super().on_activate(state)  # enables the lifecycle publishers before a frame can arrive
        self._subscribe(cfg)
        return result

    @transition("deactivate")
    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_running()
        self._clear_markers()
        return super().on_deactivate(state)

    @transition("cleanup")
    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._destroy_interfaces()
        return TransitionCallbackReturn.SUCCESS

    @transition("shutdown")
    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_running()
        self._destroy_interfaces()
        return TransitionCallbackReturn.SUCCESS

    @transition("error processing", on_exception=TransitionCallbackReturn.FAILURE)
    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_running()
        self._destroy_interfaces()
        return TransitionCallbackReturn.SUCCESS  # -> unconfigured: configure works again

    def transition_failed(self, name: str, text: str) -> None:
        """One log line naming the transition and why; the diagnostics say ERROR until the next good plan."""
        text = f"{name} failed: {text}"
        self.get_logger().error(text)
        self.stats.error(text, "lifecycle")
        if self._diagnostics_throttle.allow("lifecycle"):
            self.publish_diagnostics()

    def release(self, timeout_s: float = 1.0) -> None:
        """Stop planning and free the model without any ROS call (safe after the context shut down)."""
        with self._output_lock:
            worker, self._worker = self._worker, None
            policy, self.policy = self.policy, None
            self._planner = None
        stopped = worker.stop(timeout_s) if worker is not None else True
        if policy is None:
            return
        if stopped:
            close_policy(policy, NODE_NAME)
        else:  # a plan is still running: free the model once it returns, without blocking shutdown
            threading.Thread(target=lambda: (worker.join(), close_policy(policy, NODE_NAME)), daemon=True).start()

    def _load_policy(self, cfg: dict):
        try:
            policy = self._policy_factory(cfg["policy"])
        except Exception as exc:  # noqa: BLE001 - a model that does not load fails the transition, not the node
            raise TransitionFailure(f"loading model {cfg['model']!r} failed: {type(exc).__name__}: "
                                    f"{one_line(exc)}") from exc
        if cfg["warmup"]:
            self._warmup(policy, cfg)
        return policy

    def _subscribe(self, cfg: dict) -> None:
        qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, durability=DurabilityPolicy.VOLATILE,
                         reliability=RELIABILITY[cfg["image_reliability"]])
        # odometry, command and route target first: when they and a frame are ready together, the executor
        # takes them in creation order, so the plan uses the ego state (and target) published with the frame
        odom_qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.BEST_EFFORT)
        group = self._sensor_group
        self._subs.append(self.create_subscription(Odometry, cfg["odometry_topic"], self._on_odometry, odom_qos,
                                                   callback_group=group))
        self._subs.append(self.create_subscription(String, cfg["command_topic"], self._on_command, COMMAND_QOS,
                                                   callback_group=group))
        self._subs.append(self.create_subscription(PointStamped, cfg["route_target_topic"], self._on_route_target,
                                                   10, callback_group=group))
        for index, topic in enumerate(cfg["camera_topics"]):
            compressed = topic.rstrip("/").endswith("/compressed")
            msg_type = CompressedImage if compressed else Image
            self._subs.append(self.create_subscription(
                msg_type, topic, lambda msg, i=index, c=compressed: self._on_image(msg, i, c), qos,
                callback_group=group))

    def _stop_running(self) -> None:
        for sub in self._subs:
            self.destroy_subscription(sub)
        self._subs = []
        self.release()
        self._latest = None
        self._route_target = None

    def _clear_markers(self) -> None:
        """One DELETEALL marker, so RViz does not keep showing the last plan of a node that stopped planning."""
        pub = self._pubs.get("markers")
        if pub is not None:
            header = Header(stamp=self.get_clock().now().to_msg(), frame_id=self._cfg.get("base_frame_id", ""))
            pub.publish(MarkerArray(markers=[Marker(header=header, action=Marker.DELETEALL)]))

    def _destroy_interfaces(self) -> None:
        for pub in self._pubs.values():
            self.destroy_lifecycle_publisher(pub)
        self._pubs = {}
        if self._service is not None:
            self.destroy_service(self._service)
            self._service = None

    # ------------------------------------------------------------------ parameters

    def _declare_parameters(self) -> None:
        """Declare every parameter with its descriptor (planner_parameters.py). A float given as an integer
        (`rate_hz: 10` in YAML, `-p rate_hz:=10`) is taken as that float; a value of the wrong type or out of
        range raises ParameterError naming it."""
        overrides = self._parameter_overrides  # rclpy's: parameter files, -p and parameter_overrides= together
        for name, spec in PARAMETERS.items():
            if name in overrides:
                overrides[name] = as_declared_type(overrides[name])
            try:
                self.declare_parameter(name, spec.default, descriptor(name))
            except (InvalidParameterTypeException, InvalidParameterValueException) as exc:
                # rclpy's text: "<message>: <name>", for a bad value "Invalid parameter value ... Reason: <reason>"
                text = one_line(exc).removesuffix(f": {name}").split("Reason: ", 1)[-1]
                raise ParameterError(text if name in text else f"parameter {name}: {text}") from None

    def _check_parameters(self, params) -> SetParametersResult:
        """The on-set callback: refuse a runtime parameter's bad value with a reason naming it (rclpy itself
        refuses read-only parameters, wrong types and values out of a descriptor's range)."""
        limits, candidates = {}, {}
        for param in params:
            if param.name not in RUNTIME_PARAMETERS:
                continue
            try:
                value = check_value(param.name, param.value)
            except ParameterError as exc:
                return SetParametersResult(successful=False, reason=str(exc))
            if param.name.startswith("max_image_"):
                limits[param.name] = value
            if param.name == "candidates":
                candidates[param.name] = value
        if candidates:
            names = ("candidates", "cuda_graphs", "attention_backend")
            try:
                check_candidates_fit({**{n: self.get_parameter(n).value for n in names}, **candidates})
            except ParameterError as exc:
                return SetParametersResult(successful=False, reason=str(exc))
        if limits:
            names = ("max_image_bytes", "max_image_side", "max_image_pixels")
            current = {n: self.get_parameter(n).value for n in names}
            try:
                image_limits({**current, **limits})
            except ParameterError as exc:
                return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    def _apply_parameters(self, params) -> None:
        """The post-set callback: apply runtime parameters at once (the next frame, plan or report uses them).
        Unconfigured, they are stored and read on configure."""
        changed = {p.name: check_value(p.name, p.value) for p in params if p.name in RUNTIME_PARAMETERS}
        if not changed:
            return
        with self._apply_lock:
            if "diagnostics_period_s" in changed:
                period_s = changed["diagnostics_period_s"]
                self._diagnostics_timer.timer_period_ns = int(period_s * 1e9)
                self._diagnostics_throttle.period_s = period_s
            if not self._cfg:
                return
            cfg = dict(self._cfg, **changed)
            cfg["image_limits"] = image_limits(cfg)
            self._cfg = cfg  # callbacks read self._cfg once per message: a whole old or a whole new one
            if self._worker is not None and "rate_hz" in changed:
                self._worker.min_period_s = plan_period_s(cfg["rate_hz"])
            if self.policy is not None and CANDIDATE_PARAMETERS & set(changed):
                try:
                    self._planner = candidate_planner(self.policy, cfg)  # the next frame set plans with it
                except WamDiffError as exc:  # the policy's own settings refuse them: keep planning as before
                    self._report_error(f"candidate settings not applied: {exc}", "parameters")
                    return
                if "candidates" in changed:
                    self._clear_markers()  # no candidate of the old count stays drawn
        self.get_logger().info("applied " + ", ".join(f"{k}={v!r}" for k, v in changed.items()))

    # ------------------------------------------------------------------ inputs (executor threads)
    # Each input is checked before anything uses it (image_conversion.py, input_checks.py). A rejected message is
    # counted and reported as an ERROR of its kind; so is anything else a callback raises, which would otherwise
    # end the executor's spin and with it the node.

    def _reject(self, counter: str, what: str, exc: Exception) -> str:
        """Count a rejected input in `counter`, report it as an ERROR of that input's kind; returns the text."""
        self.stats.count(counter)
        reason = str(exc) if isinstance(exc, WamDiffError) else f"{type(exc).__name__}: {str(exc)[:200]}"
        text = f"rejected {what}: {reason}"
        self._report_error(text, INPUT_ERROR_KINDS[counter])
        return text

    def _on_image(self, msg, camera: int, compressed: bool) -> None:
        received = time.monotonic()
        self.stats.count("frames_received")
        worker, sync, cfg = self._worker, self._sync, self._cfg
        if worker is None or sync is None:
            return
        try:
            stamp = stamp_ns(msg.header.stamp, "image")
            limits = cfg["image_limits"]
            rgb = compressed_msg_to_rgb(msg, limits) if compressed else image_msg_to_rgb(msg, limits)
        except Exception as exc:  # noqa: BLE001 - see above
            self._reject("frames_rejected", f"frame on {cfg['camera_topics'][camera]}", exc)
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
            with self._odom_lock:
                self._ego_motion.add(sample)
        except Exception as exc:  # noqa: BLE001 - see above
            self._reject("odometry_rejected", f"odometry on {self._cfg['odometry_topic']}", exc)

    def _on_command(self, msg: String) -> None:
        try:
            self._command = command_text(msg.data)
        except Exception as exc:  # noqa: BLE001 - see above
            self._reject("commands_rejected", f"command on {self._cfg['command_topic']}", exc)

    def _on_route_target(self, msg: PointStamped) -> None:
        cfg = self._cfg
        try:
            self._route_target = route_target(msg, cfg["base_frame_id"])
        except Exception as exc:  # noqa: BLE001 - see above
            self._reject("route_targets_rejected", f"route target on {cfg['route_target_topic']}", exc)

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

    def _warmup(self, policy, cfg: dict) -> None:
        import numpy as np

        blank = [np.full((224, 224, 3), 128, np.uint8)] * len(cfg["camera_topics"])
        try:
            candidate_planner(policy, cfg).plan(blank, EgoState(0.0), self._command, tasks=cfg["tasks"])
        except Exception as exc:  # noqa: BLE001
            self.get_logger().warning(f"warm-up plan failed: {type(exc).__name__}: {exc}")

    def _plan(self, job: tuple[FrameSet, float]) -> None:
        frame_set, received = job
        with self._odom_lock:
            ego = self._ego_motion.state
        command, cfg, policy, planner = self._command, self._cfg, self.policy, self._planner
        if policy is None or planner is None:
            return
        target = self._target_for(frame_set.stamp_ns)
        t0 = time.perf_counter()
        failed = False
        try:
            plan = planner.plan([f.frame for f in frame_set.frames], ego, command, target=target, tasks=cfg["tasks"],
                                time_s=frame_set.stamp_ns * 1e-9)
        except Exception as exc:  # noqa: BLE001 - bad inputs for the model must not end planning
            # still answer the frame (an invalid Trajectory naming the error): closed loops wait for it
            failed = True
            text = f"policy.plan failed: {type(exc).__name__}: {exc}"
            self.stats.count("plan_errors")
            self._report_error(text, "plan")
            plan = Plan(trajectory=None, valid=False, errors={"policy": text})
        policy_s = time.perf_counter() - t0
        with self._output_lock:
            if self.policy is not policy:
                return  # deactivated while planning: publish nothing
            self._publish_plan(plan, frame_set, command, cfg, policy, policy_s)
        if failed:
            return
        stamp_age_s = (self.get_clock().now().nanoseconds - frame_set.stamp_ns) * 1e-9
        if target is not None:
            self.stats.count("plans_with_route_target")
        self.stats.plan_done(time.monotonic() - received, policy_s, stamp_age_s, plan.valid)

    def _publish_plan(self, plan: Plan, frame_set: FrameSet, command: str, cfg: dict, policy, policy_s: float) -> None:
        stamp = ns_to_stamp(frame_set.stamp_ns)
        ego_header = Header(stamp=stamp, frame_id=cfg["base_frame_id"])
        pubs = self._pubs
        decoding = getattr(policy, "config", None)  # the policy's effective B and K (parameters 0: its checkpoint's)
        pubs["trajectory"].publish(trajectory_msg(plan, ego_header, command,
                                                  getattr(decoding, "block_size", cfg["block_size"]),
                                                  getattr(decoding, "steps", cfg["denoising_steps"]), policy_s,
                                                  cfg["scorer"]))
        pubs["path"].publish(path_msg(plan, ego_header))
        pubs["markers"].publish(marker_array_msg(plan, ego_header))
        if "detection" in cfg["tasks"]:
            camera_header = Header(stamp=stamp, frame_id=frame_set.frames[0].frame_id)
            pubs["detections"].publish(detections_msg(plan.detections, camera_header, cfg["detection_min_score"]))

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
        with self._output_lock:
            if self.policy is policy:  # not deactivated meanwhile
                self._pubs["answer"].publish(msg)
        return answer, latency_s

    # ------------------------------------------------------------------ diagnostics

    def _report_error(self, text: str, kind: str) -> None:
        """Record an error of `kind` (counted at once); per kind, log it at most once per ERROR_LOG_PERIOD_S and
        publish an immediate ERROR diagnostic at most once per diagnostics period (the periodic status carries the
        rest): a flood costs each message a counter update, and one kind never silences another. An immediate
        status restarts the period, and none is sent while the last status already reports this kind: under a
        flood of one kind the node sends one status per period."""
        self.stats.error(text, kind)
        if self._log_throttle.allow(kind):
            self.get_logger().error(text)
        if kind != self._reported_error_kind and self._diagnostics_throttle.allow(kind):
            self.publish_diagnostics()
            self._diagnostics_timer.reset()

    def publish_diagnostics(self) -> None:
        """One DiagnosticStatus '<node>: planner' (planner_diagnostics.planner_status), in any lifecycle state."""
        state = self._state_machine.current_state[1]
        values = self.stats.snapshot()
        sizes = sorted(dict(self._frame_sizes).items())  # one snapshot: camera callbacks may add a camera meanwhile
        values.update(lifecycle_state=state, model=self._model, command=self._command,
                      odometry="received" if self._ego_motion.seen else "none yet (ego speed 0)",
                      model_uses_route_target=str(getattr(self.policy, "uses_route_target", "unknown")).lower(),
                      trained_frame_size="x".join(map(str, self._trained_frame)) if self._trained_frame else "unknown",
                      frame_size=",".join("x".join(map(str, v)) for _, v in sizes) or "none yet")
        planner = self._planner
        if planner is not None and planner.candidates > 1:
            stats = planner.stats
            values.update(candidates=planner.candidates, scorer=planner.scorer_name or "none",
                          candidate_wins_not_greedy=stats.non_greedy_wins, candidates_invalid=stats.invalid_candidates,
                          candidate_braking_plans=stats.braking_plans, candidate_braking_wins=stats.braking_wins)
        off_size = [(c, v) for c, v in sizes if self._trained_frame is not None and v != self._trained_frame]
        level, message = planner_status(state, self.stats.in_error, values["last_error"],
                                        int(values["plans_published"]),
                                        self._off_size_text(off_size[0][1], off_size[0][0]) if off_size else None)
        self._reported_error_kind = values["last_error_kind"] if level == DiagnosticStatus.ERROR else None
        try:
            self._diagnostics_pub.publish(diagnostics_msg(
                self.get_clock().now().to_msg(), f"{self.get_fully_qualified_name()}: planner", self._hardware_id,
                level, message, values))
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
    try:
        node = PlannerNode(policy_factory=policy_factory)
    except WamDiffError:  # a parameter of the wrong type or out of range: one line, exit status 2
        rclpy.try_shutdown()
        stop(restore=True)
        raise
    # three threads: a transition (a model load) never holds up get_state, parameters, /diagnostics or the inputs
    executor = ReadyOnceExecutor(num_threads=3)
    executor.add_node(node)
    try:  # a signal may come at any moment, also during autostart
        if node.get_parameter("autostart").value:
            node.schedule_autostart()
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
