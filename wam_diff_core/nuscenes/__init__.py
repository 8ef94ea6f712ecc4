"""nuScenes through the official devkit (`nuscenes-devkit`, requirements-nuscenes.txt).

`convert` turns a nuScenes release into the project's datasets (`wam-diff data --nuscenes`), `score` scores
open-loop plans on it (`wam-diff score --nuscenes`), `fixture` writes a small dataset in the nuScenes schema from
an embedded-world drive whose ground truth is known. The devkit is imported inside functions only (`reader`), so
the core imports without it. Conventions: docs/data.md.
"""
