#!/usr/bin/env bash
# Build the seq2serve image from a checkout, in one command:
#
#   deploy/build-image.sh [docker build arguments...]
#   deploy/build-image.sh -t seq2serve:cpu
#   deploy/build-image.sh -t seq2serve:gpu --build-arg VARIANT=gpu
#   deploy/build-image.sh -t seq2serve:local --build-arg BASE_IMAGE=my/debian-python:12
#
# It fills deploy/wheelhouse/ on the host (a seq2serve wheel built here, every
# runtime dependency as a wheel for the base image's Python and platform), then
# runs `docker build` at the repository root with the arguments passed through,
# so the build itself needs no network. DOCKER_HOST is honoured (docker reads it);
# DOCKER (default: docker) and PYTHON (default: python3, with pip) pick the tools.
# Versions come from deploy/constraints.txt (the releases the test suite passed on);
# CONSTRAINTS=FILE takes others, CONSTRAINTS= (empty) the newest the ranges allow.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
docker=${DOCKER:-docker}
python=${PYTHON:-python3}

# The Dockerfile's own defaults, unless a --build-arg overrides them.
arg_default() { sed -n "s/^ARG $1=//p" Dockerfile | head -n 1; }
base=$(arg_default BASE_IMAGE)
variant=$(arg_default VARIANT)
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --build-arg) pair=${args[i + 1]:-} ;;
    --build-arg=*) pair=${args[i]#--build-arg=} ;;
    *) continue ;;
  esac
  case $pair in
    BASE_IMAGE=*) base=${pair#BASE_IMAGE=} ;;
    VARIANT=*) variant=${pair#VARIANT=} ;;
  esac
done

# Wheels must match the base image's interpreter and C library, so ask it
# (this pulls the base image when the engine does not have it yet).
probe='import os, platform, sys
print("%d.%d" % sys.version_info[:2], platform.machine(), os.confstr("CS_GNU_LIBC_VERSION").split()[1])'
if ! target=$("$docker" run --rm --network none --entrypoint python3 "$base" -c "$probe"); then
  echo "build-image.sh: cannot run python3 in BASE_IMAGE $base (a Debian-based image with python3 is needed)" >&2
  exit 1
fi
read -r py machine glibc <<<"$target"
echo "build-image.sh: base $base: Python $py, $machine, glibc $glibc; variant $variant"

"$python" deploy/wheelhouse.py --variant "$variant" --python "$py" --machine "$machine" \
  --glibc "$glibc" --out deploy/wheelhouse --constraints "${CONSTRAINTS-deploy/constraints.txt}"

# The GPU image serves fp16 (int8's MatMulIntegerToFloat has no CUDA kernel): each
# shipped package exported again from its checkpoint, under its own name, checked
# to run whole on CUDA (--for cuda). Exported here, where the project's training
# extra (torch) is installed, so the image build needs neither torch nor network;
# EXPORT_PYTHON (default: .venv/bin/python, else PYTHON) runs it.
if [ "$variant" = gpu ]; then
  export_python=${EXPORT_PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo "$python")}
  rm -rf deploy/models-gpu && mkdir -p deploy/models-gpu
  for manifest in models/*/manifest.json; do
    name=$(basename "$(dirname "$manifest")")
    [ -d "models/checkpoints/$name" ] || { echo "build-image.sh: no models/checkpoints/$name to export $name at fp16" >&2; exit 1; }
    "$export_python" -m seq2serve.server.cli.main export "models/checkpoints/$name" \
      "deploy/models-gpu/$name" --precision fp16 --attention fused --for cuda --name "$name" \
      --quiet
  done
else
  # The CPU image serves models/; Docker's classic builder builds every stage,
  # the GPU one's COPY of this folder too, so it must exist (empty).
  mkdir -p deploy/models-gpu
fi

version=$("$python" -c 'import re, sys; print(re.search(r"^version = \"([^\"]+)\"", open("pyproject.toml").read(), re.M).group(1))')
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# Ours first: a --build-arg given on the command line comes later and wins.
exec "$docker" build --file Dockerfile \
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "CREATED=$created" \
  "$@" "$root"
