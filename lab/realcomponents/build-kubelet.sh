#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-3.0-or-later
# Build the real kubelet (k8s.io/kubernetes/cmd/kubelet), or kubeadm (cmd/kubeadm, the same module: what
# `kubeadm upgrade node` does to a node is pinned with it), from the Go module proxy into a versioned
# cache directory, at the control plane's K8S_VERSION, the same way lab/controlplane/build.sh builds
# kube-apiserver: a wrapper module requiring k8s.io/kubernetes with every staging module replaced by
# its published v0.Y.Z, the same tags and ldflags, and the same GOMODCACHE/GOCACHE, so a warm
# control-plane build makes this one mostly cache hits.  Both commands share one wrapper module (the
# kubelet's work directory).  Idempotent: with the binary cached it does not invoke the Go toolchain at
# all (warm = instant).
#
# Usage: lab/realcomponents/build-kubelet.sh [kubelet|kubeadm]   (last stdout line: the bin dir)
# Out:   $GPUHARDEN_CACHE/realcomponents/<command>-<K8S_VERSION>/<command>
# Env:   GPUHARDEN_CACHE     cache root (default ~/.cache/gpuharden)
#        GOMODCACHE/GOCACHE  where Go keeps modules / build cache (default: under $GPUHARDEN_CACHE/go/)
#        GO                  go binary (default: `go` on PATH, else /usr/local/go/bin/go)
#        BUILD_NICE          nice level for go builds (default 10)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The one place K8S_VERSION is pinned: the control plane's build script.
K8S_VERSION="$(sed -n 's/^K8S_VERSION=\(v[0-9][0-9.]*\).*/\1/p' "$HERE/../controlplane/build.sh")"
[[ "$K8S_VERSION" =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { echo "build-kubelet.sh: no K8S_VERSION in lab/controlplane/build.sh" >&2; exit 1; }
CACHE_ROOT="${GPUHARDEN_CACHE:-$HOME/.cache/gpuharden}"
COMMAND="${1:-kubelet}"
[[ "$COMMAND" == kubelet || "$COMMAND" == kubeadm ]] || { echo "build-kubelet.sh: builds kubelet or kubeadm, not $COMMAND" >&2; exit 1; }
BASE="$CACHE_ROOT/realcomponents/$COMMAND-$K8S_VERSION"
# the one wrapper module of both commands, and its lock
MODULE_BASE="$CACHE_ROOT/realcomponents/kubelet-$K8S_VERSION"
WORK="$MODULE_BASE/work"

log() { echo "build-kubelet.sh: $*" >&2; }

if [[ -x "$BASE/$COMMAND" ]]; then echo "$BASE"; exit 0; fi
mkdir -p "$WORK" "$BASE"
exec 9>"$MODULE_BASE/.lock"
flock 9
if [[ -x "$BASE/$COMMAND" ]]; then echo "$BASE"; exit 0; fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || { log "no go toolchain found (set GO=/path/to/go)"; exit 1; }
# The same environment as lab/controlplane/build.sh (CGO off, module mode, shared caches).
export GOTOOLCHAIN=local GOFLAGS="-mod=mod -modcacherw" CGO_ENABLED=0 GOWORK=off
export GOMODCACHE="${GOMODCACHE:-$CACHE_ROOT/go/mod}"
export GOCACHE="${GOCACHE:-$CACHE_ROOT/go/build}"
NICE=(nice -n "${BUILD_NICE:-10}")
log "go: $("$GO" version); GOMODCACHE=$GOMODCACHE GOCACHE=$GOCACHE"

cd "$WORK"
if [[ ! -f .prepared ]]; then
  rm -f go.mod go.sum
  "$GO" mod init gpuharden.local/kubeletbuild >/dev/null 2>&1
  gm="$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
  [[ -f "$gm" ]] || { log "could not download k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
  want="$(awk '$1=="go"{print $2; exit}' "$gm")"
  have="$("$GO" env GOVERSION | sed 's/^go//')"
  if [[ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)" != "$want" ]]; then
    log "k8s.io/kubernetes@$K8S_VERSION needs go $want, local toolchain is $have"; exit 1
  fi
  "$GO" mod edit -go="$want"
  # Only the main module's godebug lines count: copy upstream's.
  awk '$1=="godebug" && $2!="(" {print $2}' "$gm" | while read -r kv; do "$GO" mod edit -godebug="$kv"; done
  "$GO" mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  # Staging modules are required at v0.0.0 and replaced by ./staging/... upstream (ignored in a
  # dependency); k8s vX.Y.Z publishes them as v0.Y.Z.
  STAGING_VERSION="v0.${K8S_VERSION#v1.}"
  mapfile -t staging < <(awk '
    $1=="require" && $2=="(" {r=1; next}
    r && $1==")" {r=0}
    r && $2=="v0.0.0" {print $1}
    $1=="require" && $3=="v0.0.0" {print $2}' "$gm")
  [[ ${#staging[@]} -gt 20 ]] || { log "found only ${#staging[@]} staging modules in $gm"; exit 1; }
  log "replacing ${#staging[@]} staging modules with @$STAGING_VERSION"
  for m in "${staging[@]}"; do "$GO" mod edit -replace="$m=$m@$STAGING_VERSION"; done
  touch .prepared
fi

K8S_MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"
K8S_MAJOR="$(echo "${K8S_VERSION#v}" | cut -d. -f1)"
LD="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=$K8S_MAJOR -X k8s.io/component-base/version.gitMinor=$K8S_MINOR -X k8s.io/component-base/version.gitTreeState=clean"
log "building $COMMAND $K8S_VERSION"
t0=$SECONDS
"${NICE[@]}" "$GO" build -trimpath -tags=selinux,notest,grpcnotrace -ldflags "$LD" -o "$BASE/.$COMMAND.tmp" "k8s.io/kubernetes/cmd/$COMMAND"
mv -f "$BASE/.$COMMAND.tmp" "$BASE/$COMMAND"
log "built $COMMAND $K8S_VERSION in $((SECONDS - t0))s"
echo "$BASE"
