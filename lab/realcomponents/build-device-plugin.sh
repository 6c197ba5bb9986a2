#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-3.0-or-later
# Build the real NVIDIA k8s-device-plugin (cmd/nvidia-device-plugin) and the dp-listwatch client
# from the Go module proxy into a versioned cache directory. Idempotent: with both binaries cached
# it does not invoke the Go toolchain at all (warm = instant).
#
# Usage: lab/realcomponents/build-device-plugin.sh [VERSION ...]
#        (default: NVIDIA_DEVICE_PLUGIN_VERSION and NVIDIA_DEVICE_PLUGIN_OLD_VERSION from versions.env;
#        one stdout line per version: its bin dir)
# Out:   $GPUHARDEN_CACHE/realcomponents/nvidia-device-plugin-<version>/{nvidia-device-plugin,dp-listwatch}
# Env:   GPUHARDEN_CACHE     cache root (default ~/.cache/gpuharden)
#        GOMODCACHE/GOCACHE  where Go keeps modules / build cache (default: under $GPUHARDEN_CACHE/go/,
#                            shared with lab/controlplane/build.sh)
#        GO                  go binary (default: `go` on PATH, else /usr/local/go/bin/go)
#        BUILD_NICE          nice level for go builds (default 10)
#
# `go install ...@version` fails on the proxy (its deprecation lookup of @v/list answers 403), so the
# plugin is built from a wrapper module that requires it. CGO is needed: go-nvml dlopens libnvidia-ml.so.1.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
. "$HERE/versions.env"
CACHE_ROOT="${GPUHARDEN_CACHE:-$HOME/.cache/gpuharden}"
MODULE=github.com/NVIDIA/k8s-device-plugin
VERSIONS=("$@")
[[ ${#VERSIONS[@]} -gt 0 ]] || VERSIONS=("$NVIDIA_DEVICE_PLUGIN_VERSION" "$NVIDIA_DEVICE_PLUGIN_OLD_VERSION")

log() { echo "build-device-plugin.sh: $*" >&2; }
# shellcheck source=gomodule.sh
. "$HERE/gomodule.sh"

# Hash of the dp-listwatch sources: a change there rebuilds only that binary.
client_hash() {
  (cd "$HERE/dp-listwatch" && find . -type f | LC_ALL=C sort | while read -r f; do echo "$f"; cat "$f"; done) |
    sha256sum | cut -d' ' -f1
}

built() { # <bin dir>
  [[ -x "$1/nvidia-device-plugin" && -x "$1/dp-listwatch" ]] &&
    [[ "$(cat "$1/.dp-listwatch.srchash" 2>/dev/null)" == "$(client_hash)" ]]
}

build_one() { # <version>
  local version="$1"
  [[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { log "not a release version: $version"; return 2; }
  local base="$CACHE_ROOT/realcomponents/nvidia-device-plugin-$version"
  local work="$base/work"
  if built "$base"; then echo "$base"; return 0; fi

  mkdir -p "$work"
  exec 9>"$base/.lock"
  flock 9
  if built "$base"; then echo "$base"; return 0; fi

  local go
  local -a nice
  go_toolchain 1 || return 1

  cd "$work"
  wrapper_module gpuharden.local/devicepluginbuild "$MODULE" "$version" || return 1

  # Same link flags as upstream's Makefile: go-nvml resolves NVML symbols lazily at run time.
  local ld="-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files' -X $MODULE/internal/info.version=$version"
  if [[ ! -x "$base/nvidia-device-plugin" ]]; then
    log "building nvidia-device-plugin $version"
    local t0=$SECONDS
    "${nice[@]}" "$go" build -trimpath -ldflags "$ld" -o "$base/.nvidia-device-plugin.tmp" "$MODULE/cmd/nvidia-device-plugin"
    mv -f "$base/.nvidia-device-plugin.tmp" "$base/nvidia-device-plugin"
    log "built nvidia-device-plugin $version in $((SECONDS - t0))s"
  fi

  local h
  h="$(client_hash)"
  rm -rf dp-listwatch
  cp -r "$HERE/dp-listwatch" dp-listwatch
  log "building dp-listwatch against $version"
  CGO_ENABLED=0 "${nice[@]}" "$go" build -trimpath -ldflags "-s -w" -o "$base/.dp-listwatch.tmp" ./dp-listwatch
  mv -f "$base/.dp-listwatch.tmp" "$base/dp-listwatch"
  echo "$h" >"$base/.dp-listwatch.srchash"
  built "$base" || { log "build of $version incomplete"; return 1; }
  echo "$base"
}

for v in "${VERSIONS[@]}"; do
  (build_one "$v")
done
