"""Start the WAM-Diff planner as a lifecycle node and bring it to active.

    ros2 launch wam_diff_ros planner.launch.py model:=/path/to/checkpoint device:=cuda
    ros2 launch wam_diff_ros planner.launch.py camera_topics:=/front/image_raw,/left/image_raw/compressed
    ros2 launch wam_diff_ros planner.launch.py params_file:=/path/to/my_planner.yaml

Parameters come from config/planner.yaml (override with params_file); the launch arguments
below override single values. The node is configured and activated through its own `autostart`
parameter, so no lifecycle manager is needed; set autostart:=false to drive it with
`ros2 lifecycle set /wam_diff/wam_diff_planner configure|activate`, or with nav2_lifecycle_manager
(`bond_timeout: 0.0`: the planner has no bond; docs/ros.md).
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

from wam_diff_ros.launch_args import parse_topic_list

PACKAGE = "wam_diff_ros"


def camera_parameters(context) -> list[dict]:
    """The camera_topics launch argument as a list parameter, when it is given."""
    topics = parse_topic_list(context.launch_configurations.get("camera_topics", ""))
    return [{"camera_topics": topics}] if topics else []


def planner_node(context):
    return [LifecycleNode(
        package=PACKAGE,
        executable="wam-diff-planner",
        name="wam_diff_planner",
        namespace=LaunchConfiguration("namespace"),
        parameters=[
            LaunchConfiguration("params_file"),
            {
                "model": LaunchConfiguration("model"),
                "device": LaunchConfiguration("device"),
                "autostart": ParameterValue(LaunchConfiguration("autostart"), value_type=bool),
                "use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool),
            },
            *camera_parameters(context),
        ],
        output="screen",
        emulate_tty=True,
    )]


def generate_launch_description():
    args = [
        DeclareLaunchArgument("namespace", default_value="wam_diff"),
        DeclareLaunchArgument("params_file", default_value=PathJoinSubstitution(
            [FindPackageShare(PACKAGE), "config", "planner.yaml"])),
        DeclareLaunchArgument("model", default_value="nano-s-b32",
                              description="nano-s-b32 (the shipped model, models/nano-s-b32), a preset name or a "
                                          "checkpoint directory"),
        DeclareLaunchArgument("device", default_value="cpu"),
        DeclareLaunchArgument("camera_topics", default_value="",
                              description="camera topics in prompt order, comma-separated ('/compressed' suffix = "
                                          "CompressedImage); empty: the parameter file's"),
        DeclareLaunchArgument("autostart", default_value="true"),
        DeclareLaunchArgument("use_sim_time", default_value="false"),
    ]
    return LaunchDescription(args + [OpaqueFunction(function=planner_node)])
