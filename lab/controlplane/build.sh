#!/usr/bin/env bash
# Build a real Kubernetes control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler), etcd, kwok and the kubelet-validate helper from the Go module
# proxy into a versioned cache directory. Idempotent: a second run with
# everything cached does not invoke the Go toolchain at all.
#
# Usage: lab/controlplane/build.sh          (last stdout line: the bin dir)
# Env:   GPUHARDEN_CACHE   cache root (default ~/.cache/gpuharden)
#        GOMODCACHE/GOCACHE  override where Go keeps modules / build cache
#                            (default: under $GPUHARDEN_CACHE/go/)
#        GO                 go binary (default: `go` on PATH, else /usr/local/go/bin/go)
#        BUILD_NICE         nice level for go builds (default 10)
#        GPUHARDEN_CP_PRUNE=1  after a successful build delete the Go module and
#                            build caches if they are the defaults under
#                            $GPUHARDEN_CACHE/go (only bin/ is needed afterwards)
set -euo pipefail

# ---- pinned versions (the only place they are set) -------------------------
K8S_VERSION=v1.36.3     # k8s.io/kubernetes; staging modules at v0.36.3
ETCD_VERSION=v3.6.8     # go.etcd.io/etcd/server/v3; = etcd client pinned by k8s 1.36
KWOK_VERSION=v0.8.0     # sigs.k8s.io/kwok; built against client-go v0.36.1
# -----------------------------------------------------------------------------

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${GPUHARDEN_CACHE:-$HOME/.cache/gpuharden}"
KEY="${K8S_VERSION}-${ETCD_VERSION}-${KWOK_VERSION}"
BASE="$CACHE_ROOT/controlplane/$KEY"
BIN="$BASE/bin"
WORK="$BASE/work"
BINARIES=(etcd kwok kube-apiserver kube-controller-manager kube-scheduler kubelet-validate)

log() { echo "build.sh: $*" >&2; }

# Hash of the kubelet-validate sources: a change there rebuilds only that binary.
kv_hash() {
  (cd "$HERE/kubelet-validate" && find . -type f | LC_ALL=C sort | while read -r f; do echo "$f"; cat "$f"; done) |
    sha256sum | cut -d' ' -f1
}

all_built() {
  local b
  for b in "${BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
  [[ "$(cat "$BIN/.kubelet-validate.srchash" 2>/dev/null)" == "$(kv_hash)" ]]
}

# Fast path: nothing to do, no toolchain needed.
if all_built; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$BIN" "$WORK"
# Serialise concurrent builds of the same version set.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$BASE/.lock"
  flock 9
  if all_built; then echo "$BIN"; exit 0; fi
fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || { log "no go toolchain found (set GO=/path/to/go)"; exit 1; }
export GOTOOLCHAIN=local GOFLAGS="-mod=mod -modcacherw" CGO_ENABLED=0
export GOMODCACHE="${GOMODCACHE:-$CACHE_ROOT/go/mod}"
export GOCACHE="${GOCACHE:-$CACHE_ROOT/go/build}"
export GOWORK=off
NICE=(nice -n "${BUILD_NICE:-10}")
log "go: $("$GO" version); GOMODCACHE=$GOMODCACHE GOCACHE=$GOCACHE"

# go build into a temp name, then rename, so an interrupted build never leaves
# a half-written binary that the fast path would accept.
gobuild() { # <out name> <ldflags> <package>
  local out="$1" ld="$2" pkg="$3"
  log "building $out ($pkg)"
  local t0=$SECONDS
  "${NICE[@]}" "$GO" build -trimpath -tags=selinux,notest,grpcnotrace \
    -ldflags "$ld" -o "$BIN/.$out.tmp" "$pkg"
  mv -f "$BIN/.$out.tmp" "$BIN/$out"
  log "built $out in $((SECONDS - t0))s"
}

# Require the module's go version to be satisfiable by the local toolchain
# (GOTOOLCHAIN=local would otherwise fail later with a less clear message).
check_go_line() { # <go.mod path>
  local want have
  want="$(awk '$1=="go"{print $2; exit}' "$1")"
  have="$("$GO" env GOVERSION | sed 's/^go//')"
  if [[ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)" != "$want" ]]; then
    log "$1 needs go $want, local toolchain is $have"; exit 1
  fi
}

# Copy the `go` and `godebug` lines of an upstream go.mod into the wrapper
# (a dependency's godebug settings are ignored, only the main module's count).
copy_go_lines() { # <upstream go.mod>
  local gov
  gov="$(awk '$1=="go"{print $2; exit}' "$1")"
  "$GO" mod edit -go="$gov"
  awk '$1=="godebug" && $2!="(" {print $2}' "$1" | while read -r kv; do
    "$GO" mod edit -godebug="$kv"
  done
}

# ---- etcd ---------------------------------------------------------------------
if [[ ! -x "$BIN/etcd" ]]; then
  d="$WORK/etcd"; mkdir -p "$d"; cd "$d"
  if [[ ! -f go.mod ]]; then
    "$GO" mod init gpuharden.local/etcdbuild >/dev/null 2>&1
    gm="$("$GO" mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
    check_go_line "$gm"; copy_go_lines "$gm"
    "$GO" mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  fi
  # The module root package is etcd's main; -o names the binary etcd.
  gobuild etcd "-s -w" go.etcd.io/etcd/server/v3
fi

# ---- kwok ---------------------------------------------------------------------
if [[ ! -x "$BIN/kwok" ]]; then
  d="$WORK/kwok"; mkdir -p "$d"; cd "$d"
  if [[ ! -f go.mod ]]; then
    "$GO" mod init gpuharden.local/kwokbuild >/dev/null 2>&1
    gm="$("$GO" mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
    check_go_line "$gm"; copy_go_lines "$gm"
    "$GO" mod edit -require="sigs.k8s.io/kwok@$KWOK_VERSION"
  fi
  gobuild kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" sigs.k8s.io/kwok/cmd/kwok
fi

# ---- kubernetes wrapper module ----------------------------------------------------
d="$WORK/k8s"; mkdir -p "$d"; cd "$d"
if [[ ! -f .prepared ]]; then
  rm -f go.mod go.sum
  "$GO" mod init gpuharden.local/kbuild >/dev/null 2>&1
  gm="$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
  [[ -f "$gm" ]] || { log "could not download k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
  check_go_line "$gm"; copy_go_lines "$gm"
  "$GO" mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  # Staging modules: every requirement of k8s.io/kubernetes at v0.0.0 (they are
  # replaced by ./staging/... upstream, which is ignored in a dependency).
  # k8s vX.Y.Z publishes them as v0.Y.Z.
  STAGING_VERSION="v0.${K8S_VERSION#v1.}"
  mapfile -t staging < <(awk '
    $1=="require" && $2=="(" {r=1; next}
    r && $1==")" {r=0}
    r && $2=="v0.0.0" {print $1}
    $1=="require" && $3=="v0.0.0" {print $2}' "$gm")
  [[ ${#staging[@]} -gt 20 ]] || { log "found only ${#staging[@]} staging modules in $gm"; exit 1; }
  log "replacing ${#staging[@]} staging modules with @$STAGING_VERSION"
  for m in "${staging[@]}"; do
    "$GO" mod edit -replace="$m=$m@$STAGING_VERSION"
  done
  touch .prepared
fi

K8S_MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"
K8S_MAJOR="$(echo "${K8S_VERSION#v}" | cut -d. -f1)"
K8S_LD="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=$K8S_MAJOR -X k8s.io/component-base/version.gitMinor=$K8S_MINOR -X k8s.io/component-base/version.gitTreeState=clean"
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  [[ -x "$BIN/$c" ]] || gobuild "$c" "$K8S_LD" "k8s.io/kubernetes/cmd/$c"
done

# kubelet-validate: committed source, copied into the wrapper module so it is
# compiled against exactly this k8s.io/kubernetes and its staging modules.
h="$(kv_hash)"
if [[ ! -x "$BIN/kubelet-validate" || "$(cat "$BIN/.kubelet-validate.srchash" 2>/dev/null)" != "$h" ]]; then
  rm -rf kubelet-validate
  cp -r "$HERE/kubelet-validate" kubelet-validate
  gobuild kubelet-validate "$K8S_LD" ./kubelet-validate
  echo "$h" >"$BIN/.kubelet-validate.srchash"
fi

all_built || { log "build incomplete"; exit 1; }
if [[ "${GPUHARDEN_CP_PRUNE:-0}" == 1 ]]; then
  for c in "$GOCACHE" "$GOMODCACHE"; do
    case "$c" in
      "$CACHE_ROOT/go/"*) log "pruning $c"; rm -rf "$c" ;;
      *) log "not pruning $c (not under $CACHE_ROOT/go)" ;;
    esac
  done
fi
echo "$BIN"
