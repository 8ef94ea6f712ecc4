"""QoS of the latched topics: a late subscriber gets the last message (ROS 2's transient local durability).

Publisher and subscriber must both ask for transient local; a volatile subscriber still receives new
messages, a transient-local subscriber never connects to a volatile publisher.
"""
from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

# The navigation command (std_msgs/String): published when it changes, so only the last one matters.
COMMAND_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)

# /tf_static (tf2_msgs/TFMessage), as tf2_ros's StaticTransformBroadcaster publishes it: every static transform
# of a node in one message, sent once.
STATIC_TF_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.RELIABLE,
                           durability=DurabilityPolicy.TRANSIENT_LOCAL)
