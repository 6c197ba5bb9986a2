#!/bin/sh
# Build the NVML test double: build.sh [OUT_DIR]   (default: <repo>/build/nvml)
# Produces OUT_DIR/libnvidia-ml.so.1 (soname libnvidia-ml.so.1) and a
# libnvidia-ml.so symlink. Honours $CC (default gcc) and extra $CFLAGS.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
out=${1:-${NVML_DOUBLE_BUILD_DIR:-$root/build/nvml}}
cc=${CC:-gcc}
mkdir -p "$out"
tmp="$out/.libnvidia-ml.so.1.$$"
# shellcheck disable=SC2086
"$cc" -std=c11 -fPIC -O2 -Wall -Wextra -Werror -fvisibility=hidden ${CFLAGS:-} \
    -shared -Wl,-soname,libnvidia-ml.so.1 -Wl,--no-undefined \
    -o "$tmp" "$here/nvml_double.c" "$here/json.c" -lpthread
mv -f "$tmp" "$out/libnvidia-ml.so.1"
ln -sfn libnvidia-ml.so.1 "$out/libnvidia-ml.so"
echo "$out/libnvidia-ml.so.1"
