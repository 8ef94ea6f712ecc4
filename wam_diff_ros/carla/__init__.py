"""CARLA side of WAM-Diff: Bench2Drive agent, route files, frame conversion, bridge session, runner.

Importing this package never imports `carla` or `rclpy`; modules that need the CARLA client
import it where they use it, so route parsing, frames and scoring work without the optional extra.
"""
