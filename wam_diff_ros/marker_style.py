"""How the planner's MarkerArray draws a plan, shared by the node (rclpy messages) and the bag tools (rosbags
messages): colours as RGBA dicts, widths in metres. No ROS import here."""

PLAN_RGBA = dict(r=0.1, g=0.9, b=0.2, a=1.0)  # the published plan: line and waypoint spheres
PLAN_LINE_M = 0.15
WAYPOINT_M = 0.4
CANDIDATE_RGBA = dict(r=0.3, g=0.6, b=1.0, a=0.6)  # every candidate drawn, thin, beside the published plan
CANDIDATE_LINE_M = 0.05
