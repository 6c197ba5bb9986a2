#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-3.0-or-later
# Build the real NVIDIA container toolkit's runtime side from the Go module proxy into a versioned cache directory:
# nvidia-container-runtime (the binary containerd's nvidia runtime names), nvidia-cdi-hook (the OCI hooks its
# just-in-time CDI spec adds) and nvidia-ctk.  Idempotent: with all three cached it does not invoke Go (warm = instant).
#
# Usage: lab/realcomponents/build-container-toolkit.sh [VERSION]
#        (default: NVIDIA_CONTAINER_TOOLKIT_VERSION from versions.env; stdout: the bin dir)
# Out:   $GPUHARDEN_CACHE/realcomponents/nvidia-container-toolkit-<version>/{nvidia-container-runtime,nvidia-cdi-hook,nvidia-ctk}
# Env:   GPUHARDEN_CACHE, GOMODCACHE/GOCACHE, GO, BUILD_NICE as in build-device-plugin.sh.
#
# CGO is needed: go-nvml dlopens libnvidia-ml.so.1 (the lab's NVML double) when the runtime generates a CDI spec for
# a container; the link flags are upstream's (Makefile) for that reason.  libnvidia-container (the C library behind
# the legacy mode's nvidia-container-cli) is not built: the toolkit's default mode on an NVML platform is jit-cdi
# (internal/info/auto.go), which needs only these three.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
. "$HERE/versions.env"
CACHE_ROOT="${GPUHARDEN_CACHE:-$HOME/.cache/gpuharden}"
MODULE=github.com/NVIDIA/nvidia-container-toolkit
VERSION="${1:-$NVIDIA_CONTAINER_TOOLKIT_VERSION}"
COMMANDS=(nvidia-container-runtime nvidia-cdi-hook nvidia-ctk)

log() { echo "build-container-toolkit.sh: $*" >&2; }
# shellcheck source=gomodule.sh
. "$HERE/gomodule.sh"

built() { # <bin dir>
  local c
  for c in "${COMMANDS[@]}"; do [[ -x "$1/$c" ]] || return 1; done
}

[[ "$VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { log "not a release version: $VERSION"; exit 2; }
base="$CACHE_ROOT/realcomponents/nvidia-container-toolkit-$VERSION"
if built "$base"; then echo "$base"; exit 0; fi
mkdir -p "$base/work"
exec 9>"$base/.lock"
flock 9
if built "$base"; then echo "$base"; exit 0; fi

go=
nice=()
go_toolchain 1
cd "$base/work"
wrapper_module gpuharden.local/containertoolkitbuild "$MODULE" "$VERSION"
ld="-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy' -X $MODULE/internal/info.version=${VERSION#v}"
for c in "${COMMANDS[@]}"; do
  [[ -x "$base/$c" ]] && continue
  log "building $c $VERSION"
  t0=$SECONDS
  "${nice[@]}" "$go" build -trimpath -ldflags "$ld" -o "$base/.$c.tmp" "$MODULE/cmd/$c"
  mv -f "$base/.$c.tmp" "$base/$c"
  log "built $c $VERSION in $((SECONDS - t0))s"
done
built "$base" || { log "build of $VERSION incomplete"; exit 1; }
echo "$base"
