"""Choosing one plan among candidate trajectories: scorers and what they see.

- `camera.py`: the embedded world's top-down camera, ego frame <-> pixels;
- `base.py`: `ScoringContext` (what a scorer may look at), the `Scorer` protocol and `choose`;
- `terms.py`: NAVSIM-PDM-style terms of one trajectory against road users and lanes, and their product;
- `association.py`: nearest-neighbour matching of this frame's detections to the previous frame's;
- `perception.py`, `oracle.py`, `likelihood.py`: the three scorers; `registry.py`: a scorer by name.

Import from the modules (nothing is re-exported here, so the world can read `camera` without the rest).
The user guide is docs/scoring.md.
"""
