"""Perception beside the language model: the box head reading the vision encoder's outputs."""
from .files import BOX_HEAD_CONFIG, BOX_HEAD_WEIGHTS, load_box_head, save_box_head
from .head import FEATURES, BoxHead, BoxHeadConfig, BoxHeadError, feature_width, resized_size, vision_features
from .peaks import MAX_BOXES, MIN_SCORE, boxes_from_maps, detect

__all__ = ["BOX_HEAD_CONFIG", "BOX_HEAD_WEIGHTS", "FEATURES", "MAX_BOXES", "MIN_SCORE", "BoxHead", "BoxHeadConfig",
           "BoxHeadError", "boxes_from_maps", "detect", "feature_width", "load_box_head", "resized_size",
           "save_box_head", "vision_features"]
