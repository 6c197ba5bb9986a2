# SPDX-License-Identifier: GPL-3.0-or-later
# Sourced by the build-*.sh scripts here: the Go toolchain set-up and the wrapper module that requires an upstream
# module at a release (`go install ...@version` fails on the proxy: its deprecation lookup of @v/list answers 403).
# The caller defines log() and CACHE_ROOT, declares `local go; local -a nice`, and calls these in its work directory.

# go_toolchain <CGO_ENABLED>: sets $go and $nice, exports the Go settings (module and build caches shared with
# lab/controlplane/build.sh unless GOMODCACHE/GOCACHE say otherwise).
go_toolchain() {
  go="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
  [[ -x "$go" ]] || { log "no go toolchain found (set GO=/path/to/go)"; return 1; }
  export GOTOOLCHAIN=local GOFLAGS="-mod=mod -modcacherw" CGO_ENABLED="$1" GOWORK=off
  export GOMODCACHE="${GOMODCACHE:-$CACHE_ROOT/go/mod}"
  export GOCACHE="${GOCACHE:-$CACHE_ROOT/go/build}"
  nice=(nice -n "${BUILD_NICE:-10}")
  log "go: $("$go" version); GOMODCACHE=$GOMODCACHE GOCACHE=$GOCACHE"
}

# wrapper_module <local module name> <module> <version>: go.mod in the current directory requiring <module>@<version>
# at the Go version it asks for, with its replace directives copied (a dependency's own are ignored); once
# (.prepared).
wrapper_module() {
  local name="$1" module="$2" version="$3" gm want have
  [[ -f .prepared ]] && return 0
  rm -f go.mod go.sum
  "$go" mod init "$name" >/dev/null 2>&1
  gm="$("$go" mod download -json "$module@$version" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')"
  [[ -f "$gm" ]] || { log "the proxy did not serve $module@$version"; return 1; }
  want="$(awk '$1=="go"{print $2; exit}' "$gm")"
  have="$("$go" env GOVERSION | sed 's/^go//')"
  if [[ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)" != "$want" ]]; then
    log "$module@$version needs go $want, local toolchain is $have"; return 1
  fi
  "$go" mod edit -go="$want" -require="$module@$version"
  awk '$1=="replace" && $2!="(" {sub(/^replace /,""); print} $1=="replace" && $2=="(" {r=1; next} r && $1==")" {r=0} r {print}' "$gm" |
    while read -r from _ to; do "$go" mod edit -replace="$from=$to"; done
  touch .prepared
}
