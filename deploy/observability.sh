#!/usr/bin/env bash
# Observability back-ends for tests and local use, built from the Go module proxy:
#   bash deploy/observability.sh fetch   # build jaeger and prometheus into the cache (skips what is there)
#   bash deploy/observability.sh path    # print the directory holding the binaries
# Jaeger v2 is one binary: an OTLP receiver (gRPC :4317, HTTP :4318) and the query API (:16686).
# Needs: Go (`go` on PATH or in /usr/local/go/bin; installed with apt-get when root). Building takes
# minutes the first time.
set -euo pipefail

JAEGER_VERSION="${GPUSCHED_JAEGER_VERSION:-v1.75.0}"          # module version; cmd/jaeger is Jaeger v2
PROMETHEUS_VERSION="${GPUSCHED_PROMETHEUS_VERSION:-v0.316.0}"  # module version of Prometheus 3.x
BIN_DIR="${GPUSCHED_OBS_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/gpusched/bin}"
log() { echo "observability.sh: $*" >&2; }

go_bin() {
  if command -v go >/dev/null; then command -v go; return; fi
  if [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go; return; fi
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    # An older Debian Go fetches the toolchain the modules ask for (GOTOOLCHAIN=auto).
    log "installing Go with apt-get"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >&2
    command -v go; return
  fi
  log "error: Go is required to build jaeger and prometheus"; exit 1
}

build() {  # build <binary name> <module> <version> <package dir inside the module> [go build flags]
  local name="$1" module="$2" version="$3" pkg="$4" go dir
  shift 4
  if [[ -x "$BIN_DIR/$name" ]]; then return 0; fi
  mkdir -p "$BIN_DIR"
  go="$(go_bin)"
  log "building $name from $module@$version (minutes the first time)"
  # Built inside the downloaded module, not with `go install pkg@version`: Jaeger's go.mod
  # has replace directives, which `go install` refuses and a build in the module honours.
  dir="$("$go" mod download -json "$module@$version" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d "$dir" ]] || { log "error: could not download $module@$version"; exit 1; }
  (cd "$dir" && GOWORK=off "$go" build -trimpath "$@" -o "$BIN_DIR/$name.part" "./$pkg")
  mv "$BIN_DIR/$name.part" "$BIN_DIR/$name"
}

case "${1:-}" in
  fetch)
    build jaeger github.com/jaegertracing/jaeger "$JAEGER_VERSION" cmd/jaeger
    # Service discovery: file and HTTP only (the cloud ones would triple the build).
    build prometheus github.com/prometheus/prometheus "$PROMETHEUS_VERSION" cmd/prometheus -tags remove_all_sd
    ;;
  path) echo "$BIN_DIR" ;;
  *) echo "usage: $0 fetch|path" >&2; exit 2 ;;
esac
