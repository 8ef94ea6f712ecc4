"""The closed-loop demo: planner + embedded highway world bridge, on simulated time.

    ros2 launch wam_diff_ros demo.launch.py limit:=3

The same nodes with the same parameter files start without `launch` from the console script
`wam-diff-demo` (one process). The bridge publishes /clock, camera frames, odometry and the
navigation command, tracks the planner's Trajectory and prints the route scores at the end.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, RegisterEventHandler
from launch.events import Shutdown
from launch.event_handlers import OnProcessExit
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

PACKAGE = "wam_diff_ros"


def generate_launch_description():
    config = PathJoinSubstitution([FindPackageShare(PACKAGE), "config"])
    planner_yaml = PathJoinSubstitution([config, "planner.yaml"])
    demo_yaml = PathJoinSubstitution([config, "demo.yaml"])
    namespace = LaunchConfiguration("namespace")
    args = [
        DeclareLaunchArgument("namespace", default_value="wam_diff"),
        DeclareLaunchArgument("model", default_value="nano-s-b32",
                              description="nano-s-b32 (the shipped model, models/nano-s-b32), a preset name or a "
                                          "checkpoint directory"),
        DeclareLaunchArgument("device", default_value="cpu"),
        DeclareLaunchArgument("limit", default_value="1", description="number of routes to drive"),
    ]
    planner = LifecycleNode(
        package=PACKAGE,
        executable="wam-diff-planner",
        name="wam_diff_planner",
        namespace=namespace,
        parameters=[planner_yaml, demo_yaml,
                    {"model": LaunchConfiguration("model"), "device": LaunchConfiguration("device")}],
        output="screen",
        emulate_tty=True,
    )
    bridge = Node(
        package=PACKAGE,
        executable="wam-diff-highway-bridge",
        name="wam_diff_highway_bridge",
        namespace=namespace,
        parameters=[demo_yaml, {"limit": ParameterValue(LaunchConfiguration("limit"), value_type=int)}],
        output="screen",
        emulate_tty=True,
    )
    # the demo ends when the bridge has driven its routes and printed the scores
    stop = RegisterEventHandler(OnProcessExit(target_action=bridge, on_exit=[EmitEvent(event=Shutdown())]))
    return LaunchDescription(args + [planner, bridge, stop])
