"""The topics a bag holds for the planner: its default subscriptions and publications (wam_diff_ros/planner_node.py
PARAMETERS, resolved in the root namespace) with the types the highway bridge publishes on them. Defined here
because planner_node.py imports rclpy and the bag tools must not; tests/test_bag_topics.py holds both in step."""
from __future__ import annotations

IMAGE = "sensor_msgs/msg/Image"
COMPRESSED_IMAGE = "sensor_msgs/msg/CompressedImage"
ODOMETRY = "nav_msgs/msg/Odometry"
STRING = "std_msgs/msg/String"
POINT_STAMPED = "geometry_msgs/msg/PointStamped"
CLOCK = "rosgraph_msgs/msg/Clock"
CAMERA_TYPES = (IMAGE, COMPRESSED_IMAGE)

# inputs: topic -> type
CAMERA_TOPIC = "/camera/image_raw"
ODOMETRY_TOPIC = "/odom"
COMMAND_TOPIC = "/command"
ROUTE_TARGET_TOPIC = "/route_target"
CLOCK_TOPIC = "/clock"

# outputs of one planned frame set: name -> (topic, type)
OUTPUTS = {
    "trajectory": ("/trajectory", "wam_diff_msgs/msg/Trajectory"),
    "path": ("/path", "nav_msgs/msg/Path"),
    "detections": ("/detections", "wam_diff_msgs/msg/Detection2DArray"),
    "markers": ("/markers", "visualization_msgs/msg/MarkerArray"),
    "answer": ("/answer", "wam_diff_msgs/msg/DrivingAnswer"),
}

TF_STATIC_TOPIC = "/tf_static"
TF_MESSAGE = "tf2_msgs/msg/TFMessage"
# latched topics (transient local, depth 1): the command, published when it changes, and the static transforms
LATCHED_TOPICS = (COMMAND_TOPIC, TF_STATIC_TOPIC)

CAMERA_NAME = "camera_front"  # the highway bridge's camera_name: images in <name>_optical_frame (camera_tf.py)
CAMERA_FRAME_ID = f"{CAMERA_NAME}_optical_frame"
BASE_FRAME_ID = "base_link"       # the planner's base_frame_id: trajectories, paths, markers, route targets
ODOM_FRAME_ID = "odom"

# the planner's rules (parameter defaults)
SYNC_SLOP_S = 0.05
ROUTE_TARGET_MAX_AGE_S = 0.5
DEFAULT_COMMAND = "follow lane"
