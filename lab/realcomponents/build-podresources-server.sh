#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-3.0-or-later
# Build podresources-server (the kubelet's real generated v1 PodResourcesLister gRPC service over a unix
# socket, canned answers from JSON) from the Go module proxy into a cache directory keyed by the k8s.io/kubelet
# version and a hash of the sources. Idempotent: with the binary cached it does not invoke the Go toolchain
# (warm = instant).
#
# Usage: lab/realcomponents/build-podresources-server.sh   (last stdout line: the bin dir)
# Out:   $GPUHARDEN_CACHE/realcomponents/podresources-server-<kubelet version>/podresources-server
# Env:   GPUHARDEN_CACHE     cache root (default ~/.cache/gpuharden)
#        GOMODCACHE/GOCACHE  where Go keeps modules / build cache (default: under $GPUHARDEN_CACHE/go/,
#                            shared with lab/controlplane/build.sh)
#        GO                  go binary (default: `go` on PATH, else /usr/local/go/bin/go)
#        BUILD_NICE          nice level for go builds (default 10)
#
# The k8s.io/kubelet version is the control plane's (lab/controlplane/build.sh K8S_VERSION v1.X.Y: staging
# modules at v0.X.Y); podresources-server/go.mod must require the same, which this script checks.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="$HERE/podresources-server"
CACHE_ROOT="${GPUHARDEN_CACHE:-$HOME/.cache/gpuharden}"

log() { echo "build-podresources-server.sh: $*" >&2; }

k8s="$(sed -n 's/^K8S_VERSION=\(v[0-9.]*\).*/\1/p' "$HERE/../controlplane/build.sh")"
[[ "$k8s" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { log "cannot read K8S_VERSION from lab/controlplane/build.sh"; exit 1; }
KUBELET_VERSION="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
required="$(awk '$1=="k8s.io/kubelet"{print $2}' "$SRC/go.mod")"
[[ "$required" == "$KUBELET_VERSION" ]] ||
  { log "podresources-server/go.mod requires k8s.io/kubelet $required, the control plane is $KUBELET_VERSION"; exit 1; }

BASE="$CACHE_ROOT/realcomponents/podresources-server-$KUBELET_VERSION"
src_hash() { (cd "$SRC" && find . -type f | LC_ALL=C sort | while read -r f; do echo "$f"; cat "$f"; done) | sha256sum | cut -d' ' -f1; }
built() { [[ -x "$BASE/podresources-server" && "$(cat "$BASE/.srchash" 2>/dev/null)" == "$(src_hash)" ]]; }

if built; then echo "$BASE"; exit 0; fi
mkdir -p "$BASE"
exec 9>"$BASE/.lock"
flock 9
if built; then echo "$BASE"; exit 0; fi

go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$go" ]] || { log "no go toolchain found (set GO=/path/to/go)"; exit 1; }
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -modcacherw" CGO_ENABLED=0 GOWORK=off
export GOMODCACHE="${GOMODCACHE:-$CACHE_ROOT/go/mod}"
export GOCACHE="${GOCACHE:-$CACHE_ROOT/go/build}"
log "go: $("$go" version); k8s.io/kubelet $KUBELET_VERSION; GOMODCACHE=$GOMODCACHE"
h="$(src_hash)"
t0=$SECONDS
(cd "$SRC" && nice -n "${BUILD_NICE:-10}" "$go" build -trimpath -ldflags "-s -w" -o "$BASE/.podresources-server.tmp" .)
mv -f "$BASE/.podresources-server.tmp" "$BASE/podresources-server"
echo "$h" >"$BASE/.srchash"
log "built podresources-server in $((SECONDS - t0))s"
echo "$BASE"
