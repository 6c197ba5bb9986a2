#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-3.0-or-later
# Build the real containerd daemon, its `ctr` client and its runc shim from the Go module proxy into a versioned
# cache directory, one per release line the collection handles: containerd 2.x (module
# github.com/containerd/containerd/v2, config version 4 by default, reads 2 and 3) and containerd 1.7
# (module github.com/containerd/containerd, config version 2). Idempotent: with everything cached it
# does not invoke the Go toolchain at all (warm = instant).
#
# Usage: lab/realcomponents/build-containerd.sh [VERSION ...]
#        (default: CONTAINERD_VERSION and CONTAINERD_1_VERSION from versions.env;
#         last stdout line per version: its bin dir)
# Out:   $GPUHARDEN_CACHE/realcomponents/containerd-<version>/{containerd,ctr,containerd-shim-runc-v2}
#        and, with the 2.x build, cri-status (a CRI RuntimeService.Status client, ./cri-status/).
# Env:   GPUHARDEN_CACHE     cache root (default ~/.cache/gpuharden)
#        GOMODCACHE/GOCACHE  where Go keeps modules / build cache (default: under $GPUHARDEN_CACHE/go/,
#                            shared with lab/controlplane/build.sh)
#        GO                  go binary (default: `go` on PATH, else /usr/local/go/bin/go)
#        BUILD_NICE          nice level for go builds (default 10)
#
# CGO_ENABLED=0 and the tags no_btrfs no_zfs no_devmapper drop the snapshotters that need C
# headers (containerd's Makefile / BUILDING.md list the same tags); the overlayfs and native
# snapshotters stay. Version stamps: the same -X flags as containerd's Makefile (GO_LDFLAGS).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
. "$HERE/versions.env"
CACHE_ROOT="${GPUHARDEN_CACHE:-$HOME/.cache/gpuharden}"
VERSIONS=("$@")
[[ ${#VERSIONS[@]} -gt 0 ]] || VERSIONS=("$CONTAINERD_VERSION" "$CONTAINERD_1_VERSION")

log() { echo "build-containerd.sh: $*" >&2; }
# The runc shim containerd starts for each pod sandbox and container (the lab's real nodes run real pods).
SHIM=containerd-shim-runc-v2
# shellcheck source=gomodule.sh
. "$HERE/gomodule.sh"

# containerd 2.x is the /v2 module; 1.x is the root module (Go semantic import versioning).
module_of() { # <version>
  case "$1" in
    v1.*) echo github.com/containerd/containerd ;;
    *) echo "github.com/containerd/containerd/v${1:1:1}" ;;
  esac
}

# Hash of the cri-status sources: a change there rebuilds only that binary.
client_hash() {
  (cd "$HERE/cri-status" && find . -type f | LC_ALL=C sort | while read -r f; do echo "$f"; cat "$f"; done) |
    sha256sum | cut -d' ' -f1
}

built() { # <bin dir> <version>
  [[ -x "$1/containerd" && -x "$1/ctr" && -x "$1/$SHIM" ]] || return 1
  case "$2" in
    v1.*) return 0 ;;
    *) [[ -x "$1/cri-status" && "$(cat "$1/.cri-status.srchash" 2>/dev/null)" == "$(client_hash)" ]] ;;
  esac
}

build_one() { # <version>
  local version="$1"
  [[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { log "not a release version: $version"; return 2; }
  local base="$CACHE_ROOT/realcomponents/containerd-$version"
  local work="$base/work" module
  module="$(module_of "$version")"
  if built "$base" "$version"; then echo "$base"; return 0; fi

  mkdir -p "$work"
  exec 9>"$base/.lock"
  flock 9
  if built "$base" "$version"; then echo "$base"; return 0; fi

  local go
  local -a nice
  go_toolchain 0 || return 1

  cd "$work"
  wrapper_module gpuharden.local/containerdbuild "$module" "$version" || return 1

  local ld="-s -w -X $module/version.Version=${version#v} -X $module/version.Package=$module"
  local tags="no_btrfs,no_zfs,no_devmapper"
  local b t0
  for b in containerd ctr "$SHIM"; do
    [[ -x "$base/$b" ]] && continue
    log "building $b $version"
    t0=$SECONDS
    "${nice[@]}" "$go" build -trimpath -tags "$tags" -ldflags "$ld" -o "$base/.$b.tmp" "$module/cmd/$b"
    mv -f "$base/.$b.tmp" "$base/$b"
    log "built $b $version in $((SECONDS - t0))s"
  done

  # cri-status: compiled in the 2.x wrapper so it uses the k8s.io/cri-api and grpc containerd pins.
  if [[ "$version" != v1.* ]]; then
    local h
    h="$(client_hash)"
    rm -rf cri-status
    cp -r "$HERE/cri-status" cri-status
    log "building cri-status against containerd $version"
    t0=$SECONDS
    "${nice[@]}" "$go" build -trimpath -ldflags "-s -w" -o "$base/.cri-status.tmp" ./cri-status
    mv -f "$base/.cri-status.tmp" "$base/cri-status"
    echo "$h" >"$base/.cri-status.srchash"
    log "built cri-status in $((SECONDS - t0))s"
  fi
  built "$base" "$version" || { log "build of $version incomplete"; return 1; }
  echo "$base"
}

for v in "${VERSIONS[@]}"; do
  (build_one "$v")
done
