"""The planner node's parameter contract: every parameter's default, type, range, and whether it may change while
the node runs.

Two kinds:
  read-only  what the loaded model and the node's interfaces are made of (model, device, decoding, topics, QoS):
             set at start (parameter file, `-p name:=value`, launch argument) and read on configure; `ros2 param
             set` refuses them ("Trying to set a read-only parameter").
  runtime    rate, tasks, input limits, frame id, periods and timeouts: checked by the node's on-set callback
             (a bad value is refused with a reason) and applied at once, also while active.
Numbers a range bounds carry it in their descriptor (FloatingPointRange / IntegerRange, `ros2 param describe`).
A float parameter also takes an integer (`rate_hz: 10` in YAML, `ros2 param set ... rate_hz 10`): the node
stores it as a float.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.parameter import Parameter
from rclpy.validate_topic_name import validate_topic_name

from wam_diff_core.constants import (ATTENTION_BACKENDS, DETECTION_SOURCES, DTYPE_CHOICES, NAV_COMMANDS,
                                     ROUTE_TARGET_AHEAD_M, SCHEDULES, SHIPPED_MODEL, STRATEGIES, TASKS, TEXT_LAYERS)
from wam_diff_core.errors import WamDiffError
from wam_diff_core.types import check_command

from .image_conversion import MAX_PIXELS, MAX_SIDE_PX, ImageLimits
from .policy_loading import PolicySettings

# Tasks answered on every frame set; QA is asked through the AskQuestion service instead.
PLAN_TASKS = tuple(t for t in TASKS if t != "qa")
RELIABILITY = ("best_effort", "reliable")
# The candidate settings as names (wam_diff_core.scoring.registry.SCORERS less the world's oracle, and
# decoding.candidates.SAMPLING_METHODS; tested equal): the core's modules import torch, the node loads it on activate
SCORER_CHOICES = ("", "perception", "likelihood")
SAMPLING_CHOICES = ("tokens", "order")
MAX_CANDIDATES = 16


class ParameterError(WamDiffError, ValueError):
    """A parameter value the planner cannot use; the message names the parameter, the value and what was expected."""


class Spec(NamedTuple):
    """One parameter: `default` (its type is the parameter's), `description`, `runtime` (may change while the node
    runs; else read-only), `bounds` ((low, high), inclusive) and `choices` (the values a string may take)."""

    default: Any
    description: str
    runtime: bool = False
    bounds: Optional[tuple] = None
    choices: Optional[tuple] = None


PARAMETERS: dict[str, Spec] = {
    "model": Spec(SHIPPED_MODEL, f"'{SHIPPED_MODEL}' (the shipped model: models/{SHIPPED_MODEL} of the source, or "
                                 f"share/wam_diff_ros/models/{SHIPPED_MODEL} of an install prefix), a preset name or "
                                 f"a local checkpoint directory; 'fake' = no model (wiring tests)"),
    "device": Spec("cpu", "torch device: cpu, cuda, cuda:0, ..."),
    "dtype": Spec("", "weights' dtype ('' = the checkpoint's own on a GPU, float32 on a CPU; auto = bfloat16 for B > 1 "
                      "on a CPU with native bf16)", choices=("",) + DTYPE_CHOICES),
    "attention_backend": Spec("sdpa", "attention backend (flashinfer: GPU)", choices=ATTENTION_BACKENDS),
    "cuda_graphs": Spec(False, "capture the block decode step as a CUDA graph (GPU only)"),
    "text_layers": Spec("model", "text layers: the model's own, 'fast' (merged projections, same math) or "
                                 "'compiled' (fast + torch.compile)", choices=TEXT_LAYERS),
    "torch_threads": Spec(0, "torch CPU threads of the planning (0 = torch's default, one per core); 1 on a 2-core "
                             "machine leaves a core to ROS and the camera", bounds=(0, 256)),
    "block_size": Spec(0, "B: tokens denoised in parallel per block (1 = autoregressive; 0 = the checkpoint's own)",
                       bounds=(0, 1024)),
    "denoising_steps": Spec(0, "K: denoising steps per block (0 = the checkpoint's own)", bounds=(0, 1024)),
    "remasking_strategy": Spec("", "remasking strategy ('' = the checkpoint's own)", choices=("",) + STRATEGIES),
    "remasking_threshold": Spec(0.0, "confidence threshold of low_confidence_dynamic (0 = the checkpoint's own)",
                                bounds=(0.0, 1.0)),
    "commit_schedule": Spec("", "positions committed per denoising step ('' = the checkpoint's own; "
                                "wam_diff_core/decoding/remasking.py)", choices=("",) + SCHEDULES),
    "max_new_tokens": Spec(0, "token budget per answer; 0 = the policy's per-task budget", bounds=(0, 8192)),
    "kinematic_envelope": Spec(True, "decode plans inside the kinematic envelope (wam_diff_core/decoding/envelope.py; "
                                     "eager and CUDA-graph paths alike)"),
    "forward_only": Spec("", "the envelope also keeps plans from stepping back along the ego's heading: on, off, or "
                             "'' (the checkpoint's own)", choices=("", "on", "off")),
    "tasks": Spec(["planning"], f"tasks run on every frame set, a non-empty subset of {list(PLAN_TASKS)}",
                  runtime=True),
    "detections": Spec("auto", "where detections come from: the checkpoint's box head (read from the vision encoder, "
                               "no extra decoding), its text answer, or auto (the head when the checkpoint has one)",
                        choices=DETECTION_SOURCES),
    "detection_min_score": Spec(0.0, "boxes scored under this are not published (0 = every box the policy wrote; "
                                     "the box head's precision and recall per threshold: docs/perception.md)",
                                runtime=True, bounds=(0.0, 1.0)),
    "candidates": Spec(1, "candidate trajectories per frame set, decoded as one batch from one prefill (1 = the "
                          "greedy plan alone; more: eager decoding, no CUDA graphs or FlashInfer)", runtime=True,
                       bounds=(1, MAX_CANDIDATES)),
    "scorer": Spec("", "picks the published candidate: perception (the model's own detections, read as top-down "
                       "frames; adds the detection task), likelihood (the model's token log-probability), '' = "
                       "candidate 0, the greedy plan (docs/scoring.md)", runtime=True, choices=SCORER_CHOICES),
    "candidate_sampling": Spec("tokens", "how candidates 1..N-1 are drawn: tokens sampled at temperature 1, or the "
                                         "greedy tokens committed in a noisy order", runtime=True,
                               choices=SAMPLING_CHOICES),
    "candidate_braking": Spec(True, "with the perception scorer: when every candidate is forecast to collide, also "
                                    "score the greedy path braked at 1.5 to 8 m/s^2 and publish the best "
                                    "(docs/scoring.md)", runtime=True),
    "camera_topics": Spec(["/camera/image_raw"], "camera topics in prompt order; '/compressed' suffix = "
                                                 "CompressedImage"),
    "image_reliability": Spec("best_effort", "camera QoS reliability (depth is always 1)", choices=RELIABILITY),
    "max_image_bytes": Spec(ImageLimits.max_bytes, "largest CompressedImage accepted, bytes; a larger one is rejected "
                                                   "before decoding", runtime=True, bounds=(1, 2**31 - 1)),
    "max_image_side": Spec(ImageLimits.max_side, "largest width or height of a camera frame, pixels; checked from a "
                                                 "raw Image's fields or a compressed image's header, before decoding",
                           runtime=True, bounds=(1, MAX_SIDE_PX)),
    "max_image_pixels": Spec(ImageLimits.max_pixels, "largest width x height of a camera frame (at most Pillow's "
                                                     "decompression-bomb threshold); checked before decoding",
                             runtime=True, bounds=(1, MAX_PIXELS)),
    "sync_slop_s": Spec(0.05, "largest stamp spread accepted between matched cameras, seconds", bounds=(0.0, 10.0)),
    "odometry_topic": Spec("/odom", "nav_msgs/Odometry of the ego vehicle (twist in the ego frame)"),
    "command_topic": Spec("command", "std_msgs/String navigation command (transient local: the last one is kept)"),
    "default_command": Spec("follow lane", f"command used until one arrives; one of {list(NAV_COMMANDS)}"),
    "route_target_topic": Spec("route_target", f"geometry_msgs/PointStamped route target point: the route "
                                               f"{ROUTE_TARGET_AHEAD_M:g} m ahead along the route, x, y in "
                                               f"base_frame_id (z ignored)"),
    "route_target_max_age_s": Spec(0.5, "a route target is used for a frame set only when their stamps differ by at "
                                        "most this many seconds; otherwise the plan has no target", runtime=True,
                                   bounds=(0.0, 60.0)),
    "rate_hz": Spec(10.0, "most plans per second; the node plans on the newest frame set when free (0 = no cap)",
                    runtime=True, bounds=(0.0, 1000.0)),
    "base_frame_id": Spec("base_link", "frame of trajectory, path and markers (ego: x forward, y left)", runtime=True),
    "diagnostics_period_s": Spec(1.0, "period of the /diagnostics status in every lifecycle state, seconds; an error "
                                      "kind also reports at once, at most once per period", runtime=True,
                                 bounds=(0.01, 3600.0)),
    "ask_timeout_s": Spec(30.0, "longest AskQuestion waits for the model, seconds", runtime=True,
                          bounds=(0.1, 3600.0)),
    "warmup": Spec(True, "run one plan on a blank image on activate so the first frame is not slow"),
    "autostart": Spec(False, "configure and activate on start (console scripts, launch without a lifecycle manager)"),
}
RUNTIME_PARAMETERS = frozenset(name for name, spec in PARAMETERS.items() if spec.runtime)
TOPIC_PARAMETERS = ("odometry_topic", "command_topic", "route_target_topic")


def descriptor(name: str) -> ParameterDescriptor:
    """The ParameterDescriptor of `name`: type, description (with the choices), read-only unless runtime, range."""
    spec = PARAMETERS[name]
    text = spec.description + (f"; one of {list(spec.choices)}" if spec.choices else "")
    d = ParameterDescriptor(name=name, type=Parameter.Type.from_parameter_value(spec.default).value,
                            description=text, read_only=not spec.runtime)
    if spec.bounds is not None:
        low, high = spec.bounds
        if isinstance(spec.default, float):
            d.floating_point_range = [FloatingPointRange(from_value=float(low), to_value=float(high), step=0.0)]
        else:
            d.integer_range = [IntegerRange(from_value=int(low), to_value=int(high), step=1)]
    return d


def as_declared_type(param: Parameter) -> Parameter:
    """`param` with an integer value turned into a float where the parameter is a float (`rate_hz: 10`)."""
    spec = PARAMETERS.get(param.name)
    if spec is not None and isinstance(spec.default, float) and param.type_ == Parameter.Type.INTEGER:
        return Parameter(param.name, Parameter.Type.DOUBLE, float(param.value))
    return param


def _topic(name: str, value) -> str:
    try:
        validate_topic_name(str(value))
    except Exception as exc:  # noqa: BLE001 - rclpy's InvalidTopicNameException, or a TypeError
        reason = str(exc).split(":\n")[0]  # rclpy adds the name again and a caret under the bad character
        raise ParameterError(f"{name} must be a topic name, got {str(value)!r} ({reason})") from None
    return str(value)


def check_value(name: str, value):
    """`value` checked against `name`'s contract, as the node uses it (lists -> tuples of str for tasks and
    camera topics); raises ParameterError naming the parameter, the value and what was expected."""
    spec = PARAMETERS[name]
    if name == "scorer" and isinstance(value, str) and value.strip().lower() == "oracle":
        raise ParameterError("scorer 'oracle' reads the embedded world's true vehicles and lanes; a ROS node has no "
                             "world: use perception or likelihood")
    if spec.bounds is not None:
        low, high = spec.bounds
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ParameterError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    if spec.choices is not None and value not in spec.choices:
        raise ParameterError(f"{name} must be one of {list(spec.choices)}, got {value!r}")
    if name == "tasks":
        tasks = tuple(str(t) for t in (value or ()))
        if not tasks or any(t not in PLAN_TASKS for t in tasks) or len(set(tasks)) != len(tasks):
            raise ParameterError(f"tasks must be a non-empty subset of {list(PLAN_TASKS)}, got {list(tasks)}")
        return tasks
    if name == "camera_topics":
        topics = tuple(str(t) for t in (value or ()))
        if not topics:
            raise ParameterError("camera_topics must be a non-empty list of topic names, got []")
        return tuple(_topic(name, t) for t in topics)
    if name in TOPIC_PARAMETERS:
        return _topic(name, value)
    if name == "base_frame_id" and (not value or value.startswith("/") or value != value.strip()):
        raise ParameterError(f"base_frame_id must be a frame name without a leading '/' or spaces, got {value!r}")
    if name == "default_command":
        try:
            return check_command(value)
        except ValueError as exc:
            raise ParameterError(f"default_command: {exc}") from None
    return float(value) if isinstance(spec.default, float) else value


def check_candidates_fit(cfg: dict) -> None:
    """Raise ParameterError when `cfg` asks for candidates > 1 on a path that cannot draw them (CUDA graphs,
    FlashInfer: candidates decode on the eager path)."""
    if cfg["candidates"] > 1 and (cfg["cuda_graphs"] or cfg["attention_backend"] == "flashinfer"):
        raise ParameterError(f"candidates {cfg['candidates']} decode on the eager path: expected cuda_graphs false and "
                             f"attention_backend sdpa or flex, got cuda_graphs {cfg['cuda_graphs']}, attention_backend "
                             f"{cfg['attention_backend']!r}")


def read_config(values: dict) -> dict:
    """Every parameter checked (check_value) from `values` (name -> value), plus the derived settings the node uses:
    `image_limits` (ImageLimits) and `policy` (PolicySettings). Raises ParameterError for the first bad value."""
    cfg = {name: check_value(name, values[name]) for name in PARAMETERS}
    check_candidates_fit(cfg)
    cfg["image_limits"] = image_limits(cfg)
    cfg["policy"] = PolicySettings(
        model=cfg["model"], device=cfg["device"], dtype=cfg["dtype"], attention_backend=cfg["attention_backend"],
        cuda_graphs=cfg["cuda_graphs"], block_size=cfg["block_size"], denoising_steps=cfg["denoising_steps"],
        remasking_strategy=cfg["remasking_strategy"], remasking_threshold=cfg["remasking_threshold"],
        max_new_tokens=cfg["max_new_tokens"], tasks=cfg["tasks"], kinematic_envelope=cfg["kinematic_envelope"],
        commit_schedule=cfg["commit_schedule"], forward_only=cfg["forward_only"], text_layers=cfg["text_layers"],
        torch_threads=cfg["torch_threads"], detections=cfg["detections"])
    return cfg


def image_limits(cfg: dict) -> ImageLimits:
    try:
        return ImageLimits(cfg["max_image_bytes"], cfg["max_image_side"], cfg["max_image_pixels"])
    except ValueError as exc:
        raise ParameterError(str(exc)) from None

