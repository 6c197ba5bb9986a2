#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-3.0-or-later
# What real pods on the lab's real nodes need besides containerd, its runc shim and the kubelet: the CNI plugins
# the lab's network config names (bridge, host-local, loopback) from github.com/containernetworking/plugins on the
# Go module proxy, and the sandbox process (pause/pause.c, a static binary: no registry is reachable here, so the
# lab builds the sandbox image from it, gpuharden_lab.realnode).  Idempotent: warm = no compiler run at all.
#
# Usage: lab/realcomponents/build-pod-support.sh   (last stdout lines: the CNI bin dir, then the pause dir)
# Out:   $GPUHARDEN_CACHE/realcomponents/cni-plugins-<CNI_PLUGINS_VERSION>/{bridge,host-local,loopback}
#        $GPUHARDEN_CACHE/realcomponents/pause-<source hash>/pause
# Env:   GPUHARDEN_CACHE, GOMODCACHE/GOCACHE, GO, BUILD_NICE: as build-containerd.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
. "$HERE/versions.env"
CACHE_ROOT="${GPUHARDEN_CACHE:-$HOME/.cache/gpuharden}"
PLUGINS=(main/bridge ipam/host-local main/loopback)

log() { echo "build-pod-support.sh: $*" >&2; }
# shellcheck source=gomodule.sh
. "$HERE/gomodule.sh"

build_cni() {
  local base="$CACHE_ROOT/realcomponents/cni-plugins-$CNI_PLUGINS_VERSION" module=github.com/containernetworking/plugins
  local p missing=() go t0
  local -a nice
  for p in "${PLUGINS[@]}"; do [[ -x "$base/${p##*/}" ]] || missing+=("$module/plugins/$p"); done
  if [[ ${#missing[@]} -gt 0 ]]; then
    mkdir -p "$base/work"
    exec 9>"$base/.lock"
    flock 9
    go_toolchain 0 || return 1
    cd "$base/work"
    wrapper_module gpuharden.local/cnibuild "$module" "$CNI_PLUGINS_VERSION" || return 1
    log "building CNI plugins $CNI_PLUGINS_VERSION"
    t0=$SECONDS
    rm -rf "$base/.out" && mkdir -p "$base/.out"
    "${nice[@]}" "$go" build -trimpath -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" \
      -o "$base/.out/" "${missing[@]}"
    mv -f "$base/.out/"* "$base/" && rmdir "$base/.out"
    log "built CNI plugins in $((SECONDS - t0))s"
  fi
  echo "$base"
}

build_pause() {
  local hash base
  hash="$(sha256sum "$HERE/pause/pause.c" | cut -c1-16)"
  base="$CACHE_ROOT/realcomponents/pause-$hash"
  if [[ ! -x "$base/pause" ]]; then
    mkdir -p "$base"
    gcc -static -Os -s -o "$base/.pause.tmp" "$HERE/pause/pause.c"
    mv -f "$base/.pause.tmp" "$base/pause"
    log "built pause ($hash)"
  fi
  echo "$base"
}

(build_cni)
build_pause
