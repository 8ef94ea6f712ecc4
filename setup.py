"""ament_python package `wam_diff_ros` (colcon, or `pip install -e .` as `make install` does); it also installs the
libraries wam_diff_core, wam_diff_kernels and wam_diff_training, and no other top-level name. colcon puts the console
scripts in lib/wam_diff_ros (setup.cfg), the launch and parameter files in share/wam_diff_ros (docs/ros.md,
"Building with colcon")."""
from glob import glob

from setuptools import find_packages, setup

PACKAGE = "wam_diff_ros"

setup(
    name=PACKAGE,
    version="1.0.0",
    # flat layout: the packages sit at the repository root (an editable install puts the root on sys.path)
    package_dir={"": "."},
    packages=find_packages(include=["wam_diff_core*", "wam_diff_kernels*", "wam_diff_training*", "wam_diff_ros*"]),
    package_data={"wam_diff_core.data": ["*.json"]},  # the closed-loop route suite
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
        # the shipped checkpoints, found by name from an install prefix (wam_diff_core/model/shipped.py)
        *[(f"share/{PACKAGE}/{d}", sorted(glob(f"{d}/*"))) for d in sorted(glob("models/*/"))],
    ],
    python_requires=">=3.11",  # the pinned transformers needs it
    install_requires=["setuptools"],
    extras_require={
        "gpu": ["flashinfer-python==0.7.0"],
        "carla": ["carla-0-9-15==0.0.1"],
    },
    zip_safe=False,
    maintainer="WAM-Diff ROS team",
    maintainer_email="maintainers@wam-diff-ros.org",
    description="Block-diffusion driving VLA (WAM-Diff2) as a ROS 2 package",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "wam-diff = wam_diff_core.cli:main",
            "wam-diff-train = wam_diff_training.cli:main",
            "wam-diff-planner = wam_diff_ros.planner_node:main",
            "wam-diff-highway-bridge = wam_diff_ros.highway_bridge_node:main",
            "wam-diff-demo = wam_diff_ros.demo:main",
            "wam-diff-ros-latency = wam_diff_ros.latency_probe:main",
            "wam-diff-bench2drive = wam_diff_ros.carla.runner:main",
            "wam-diff-carla-bridge = wam_diff_ros.carla_bridge_node:main",
            "wam-diff-bag = wam_diff_ros.bag.cli:main",
        ],
        "wam_diff_core.extensions": ["kernels = wam_diff_kernels.plugin:register"],
    },
)
