"""Project-wide constants, defined once (docs/architecture.md)."""

# Trajectory contract: 8 waypoints at 0.5 s spacing over 4 s, ego frame (x forward, y left, metres).
NUM_WAYPOINTS = 8
WAYPOINT_DT_S = 0.5
HORIZON_S = NUM_WAYPOINTS * WAYPOINT_DT_S
TRAJECTORY_DECIMALS = 2
# Trajectory text styles: "official" is WAM-Diff2's "x1,y1,...", numbers as short as they print;
# "fixed" prints every number as sign + TRAJECTORY_FIXED_INT_DIGITS integer digits + decimals
# ("+012.34"), spelled one character per token, so each answer position has one role (see codec).
TRAJECTORY_FORMATS = ("official", "fixed")
TRAJECTORY_FIXED_INT_DIGITS = 3

# The embedded world's longitudinal actuation limits (m/s^2) on the policy-driven ego (sim/highway.py clips to them).
EGO_ACCEL_LIMITS_MPS2 = (-8.0, 5.0)
# Kinematic envelope of a decoded plan (decoding/envelope.py): each axis' acceleration implied by the waypoints'
# second differences, ego frame. Forward: the actuation limits widened by ENVELOPE_MARGIN_MPS2 (2-decimal rounding,
# the forward part of centripetal acceleration in turns); lateral: +-ENVELOPE_LATERAL_MPS2. The expert's plans lie
# inside: over the 7,071 plans of one `wam-diff data` set forward -6.8 .. +3.3 m/s^2 but for one sample at -13.3,
# lateral within +-4.8 m/s^2.
ENVELOPE_MARGIN_MPS2 = 1.0
ENVELOPE_ACCEL_X_MPS2 = (EGO_ACCEL_LIMITS_MPS2[0] - ENVELOPE_MARGIN_MPS2, EGO_ACCEL_LIMITS_MPS2[1] + ENVELOPE_MARGIN_MPS2)
ENVELOPE_LATERAL_MPS2 = 6.0

# The embedded world's camera frame (W, H) in pixels at its fixed 3 px/m: what `wam-diff data`, `drive`, `dagger`,
# `sensitivity` and the ROS bridge render unless told otherwise. A learned policy's checkpoint records the frame
# size its planning data was rendered at (`wam_diff.json` frame_size); the closed-loop tools take that one for it.
FRAME_SIZE = (256, 128)
# 10 Hz ticks between plans in the embedded world's closed loops (the controller tracks the last plan in between):
# the protocol every report drove, and the default of `wam-diff drive`, `dagger` and the ROS bridge.
# Planning every tick drove the previously shipped model worse (DS 62.2 against 66.7 at 4, more collisions: plans
# flip).
REPLAN_EVERY = 4

# Below this speed (m/s) the ego counts as stopped: a closed loop's "agent blocked" clock runs, and the driving data
# trims long waits (`wam-diff data --wait-keep-s`).
BLOCKED_SPEED_MPS = 0.1

# Qwen3-VL grounding boxes are relative to the image on a 0..BOX_SCALE scale.
BOX_SCALE = 1000

# Special tokens. MASK_TOKEN is the diffusion mask; EOS_TOKEN ends an answer (Qwen chat turn end).
MASK_TOKEN = "<|mask|>"
EOS_TOKEN = "<|im_end|>"
IM_START_TOKEN = "<|im_start|>"
PAD_TOKEN = "<|endoftext|>"
VISION_START_TOKEN = "<|vision_start|>"
VISION_END_TOKEN = "<|vision_end|>"
IMAGE_PAD_TOKEN = "<|image_pad|>"
VIDEO_PAD_TOKEN = "<|video_pad|>"
IMAGE_PLACEHOLDER = "<image>"  # marks an image in dataset human turns

# Navigation commands understood by prompts, planners and simulators (lower-case phrases).
NAV_COMMANDS = (
    "follow lane",
    "turn left",
    "turn right",
    "go straight",
    "change lane left",
    "change lane right",
)

# Route target point (the point a route planner hands the planner, as CARLA leaderboard agents get theirs): the
# route's centreline this far ahead of the ego along the route, in the ego frame. The embedded world gives one on
# routes that take a junction (intersections, roundabouts), where the command alone does not say which branch;
# a checkpoint trained with such prompts records `route_target: true` in its wam_diff.json.
ROUTE_TARGET_AHEAD_M = 25.0
# The route types that take a junction (the world's corridor routes), where a route target point can be stated. A
# checkpoint may have learned targets on some of them only (`wam_diff.json` route_target_scenarios); the closed
# loop's world then states them there alone.
JUNCTION_SCENARIOS = ("intersection", "roundabout")

# Decoding (wam_diff_core/decoding; the fields of DecoderConfig that take one of these):
# remasking strategies: which masked positions of a block a denoising step commits (decoding/remasking.py);
STRATEGIES = ("low_confidence_dynamic", "low_confidence_static", "sequential")
# how many of a block's masked positions each step commits (remasking.masked_after): "linear" spreads them
# evenly over the K steps; "cosine" (MaskGIT's schedule) commits few in the first steps and more later;
SCHEDULES = ("linear", "cosine")
# text layers of the decoders (eager and static paths): the model's own, the fast ones (wam_diff_kernels.fast_layers:
# merged projections, fewer kernels), or those with their pure parts torch.compiled;
TEXT_LAYERS = ("model", "fast", "compiled")
# attention backends: torch SDPA and flex attention (CPU and GPU), FlashInfer (GPU, from kernels/).
ATTENTION_BACKENDS = ("sdpa", "flex", "flashinfer")
# weight dtypes a user may ask for (model/precision.py; unset: the checkpoint's own on a GPU, float32 on a CPU)
DTYPES = ("float32", "bfloat16", "float16")
# "auto" (DrivingPolicy.load): on a CPU bfloat16 for block decoding (B > 1) where the CPU multiplies bf16 natively
# (AVX512-BF16 or AMX), else float32; on a GPU the checkpoint's own
DTYPE_AUTO = "auto"
DTYPE_CHOICES = DTYPES + (DTYPE_AUTO,)

# Tasks the policy can answer in one token space.
TASKS = ("planning", "detection", "qa")
# where a policy's detections come from: the checkpoint's box head (`perception`), the model's text answer, or
# the head when the checkpoint has one and the text otherwise
DETECTION_SOURCES = ("auto", "head", "text")

# The shipped model (the B = 32 block-diffusion planner): the default of `wam-diff decode`, `wam-diff demo` and the
# ROS planner. The name stands for the repository's models/nano-s-b32 (`model.shipped.resolve_model`).
SHIPPED_MODEL = "nano-s-b32"

# Diffusion settings file stored next to a Hugging Face checkpoint.
WAM_DIFF_CONFIG_NAME = "wam_diff.json"
