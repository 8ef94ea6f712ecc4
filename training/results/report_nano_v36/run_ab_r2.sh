#!/usr/bin/env bash
# v36, fourth part (rule 6, README.md here; fixed before any result of these runs):
# R27, R28: F27, F28 with one torch thread (rounding only), run side by side, then scored like the others.
exec bash "$(dirname "$0")/run_ab_r.sh" 27 28
