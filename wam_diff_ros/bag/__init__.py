"""rosbag2 recordings of the planner's topics, read and written with the pure-Python `rosbags` library (no ROS
install and no DDS needed, except for `replay --realtime`): `wam-diff-bag record | replay | to-dataset` (cli.py).
How to use them: docs/data.md."""
