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

  local go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
  [[ -x "$go" ]] || { log "no go toolchain found (set GO=/path/to/go)"; return 1; }
  export GOTOOLCHAIN=local GOFLAGS="-mod=mod -modcacherw" CGO_ENABLED=1 GOWORK=off
  export GOMODCACHE="${GOMODCACHE:-$CACHE_ROOT/go/mod}"
  export GOCACHE="${GOCACHE:-$CACHE_ROOT/go/build}"
  local nice=(nice -n "${BUILD_NICE:-10}")
  log "go: $("$go" version); GOMODCACHE=$GOMODCACHE GOCACHE=$GOCACHE"

  cd "$work"
  if [[ ! -f .prepared ]]; then
    rm -f go.mod go.sum
    "$go" mod init gpuharden.local/devicepluginbuild >/dev/null 2>&1
    local gm want have
    gm="$("$go" mod download -json "$MODULE@$version" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
    [[ -f "$gm" ]] || { log "the proxy did not serve $MODULE@$version"; return 1; }
    want="$(awk '$1=="go"{print $2; exit}' "$gm")"
    have="$("$go" env GOVERSION | sed 's/^go//')"
    if [[ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)" != "$want" ]]; then
      log "$MODULE@$version needs go $want, local toolchain is $have"; return 1
    fi
    "$go" mod edit -go="$want" -require="$MODULE@$version"
    # The plugin's own replace directives are ignored in a dependency: copy them (v0.18.2 has none).
    awk '$1=="replace" && $2!="(" {sub(/^replace /,""); print} $1=="replace" && $2=="(" {r=1; next} r && $1==")" {r=0} r {print}' "$gm" |
      while read -r from _ to; do "$go" mod edit -replace="$from=$to"; done
    touch .prepared
  fi

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
