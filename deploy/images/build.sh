#!/usr/bin/env bash
# Builds a sandmesh image locally from Debian packages (no container registry needed).
#
#   IMG=$(deploy/images/build.sh)       # -> sandmesh/sandbox:<12 hex>, also tagged :latest
#   IMG=$(deploy/images/build.sh aio)   # -> sandmesh/aio:<12 hex> (aio-pool instances)
#   IMG=$(deploy/images/build.sh chromium)  # -> sandmesh/chromium:<12 hex>, the Chromium layer
#                                       #    the AIO and browser images are built FROM
#
# Progress goes to stderr; the only stdout line is the image reference (printed last).
# Idempotent: the tag is a content hash of the Dockerfile(s), the base image id and the
# supervisor binary, and an existing tag is reused ("up to date").
#
# Environment (all optional):
#   BASE_IMAGE              start from this image (e.g. debian:bookworm-slim) instead of
#                           debootstrapping sandmesh/debian:bookworm
#   DEBIAN_MIRROR           debootstrap mirror (default: the one this machine's apt uses)
#   DEBIAN_SECURITY_MIRROR  security mirror written into the base image's apt sources
#                           (default: this machine's apt's security source)
#   SUPERVISOR_BIN          (sandbox) path to the sandmesh-supervisor binary; installed as
#                           /usr/local/bin/sandmesh-supervisor (mode 0755)
#   AGENT_BIN               (aio) path to the sandmesh-aio-agent binary; installed as
#                           /usr/local/bin/sandmesh-aio-agent (mode 0755), the command
#   BUILD_NETWORK           `docker build --network` value (e.g. host) if the default bridge
#                           cannot reach the mirror
#   REBUILD=1               rebuild everything (base included, no build cache)
#   RUNTIME_ONLY=1          build the layers below our binary only (base, runtime) and print
#                           the runtime's reference: `scripts/up.sh` does this while the
#                           binary compiles, and the image then takes seconds
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

readonly SUITE=bookworm
readonly BASE_TAG=sandmesh/debian:bookworm
# Which image: its directory, repositories, and the one binary of ours it carries (added as a
# last layer, so changing the binary rebuilds only that layer).
case "${1:-sandbox}" in
    sandbox)
        readonly TARGET=sandbox RUNTIME_REPO=sandmesh/sandbox-runtime REPO=sandmesh/sandbox
        readonly BIN_NAME=sandmesh-supervisor BIN_LABEL=org.sandmesh.supervisor
        readonly BIN_DOCKERFILE=Dockerfile.supervisor BIN=${SUPERVISOR_BIN:-} BIN_VAR=SUPERVISOR_BIN
        readonly BIN_ROLE=supervisor
        ;;
    aio)
        readonly TARGET=aio RUNTIME_REPO=sandmesh/aio-runtime REPO=sandmesh/aio
        readonly BIN_NAME=sandmesh-aio-agent BIN_LABEL=org.sandmesh.aio-agent
        readonly BIN_DOCKERFILE=Dockerfile.agent BIN=${AGENT_BIN:-} BIN_VAR=AGENT_BIN
        readonly BIN_ROLE=agent
        ;;
    chromium)
        readonly TARGET=chromium RUNTIME_REPO=sandmesh/chromium REPO=sandmesh/chromium
        readonly BIN_NAME= BIN_LABEL= BIN_DOCKERFILE= BIN= BIN_VAR= BIN_ROLE=
        ;;
    *) printf 'build.sh: unknown image %s (sandbox | aio | chromium)\n' "$1" >&2; exit 64 ;;
esac
# The Debian archive this machine's own apt uses (no registry host is written in the
# repository): the first URI of a `deb` source whose suite is the release (`main`) or its
# `-security` suite (`security`), from deb822 `.sources` files or one-line `sources.list`.
apt_uri() {
    local kind=$1 files=()
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] && files+=("$f")
    done
    [ ${#files[@]} -gt 0 ] || return 0
    awk -v kind="$kind" '
        function wanted(suite) { return kind == "security" ? suite ~ /-security$/ : suite !~ /-(security|updates|backports)$/ }
        function stanza() { if (types ~ /(^| )deb( |$)/ && uri != "") { n = split(suites, s, " "); for (i = 1; i <= n; i++) if (wanted(s[i])) { print uri; done = 1; exit } } types = ""; uri = ""; suites = "" }
        FNR == 1 { if (deb822) stanza(); deb822 = FILENAME ~ /\.sources$/ }
        deb822 {
            if ($0 ~ /^[[:space:]]*$/) { stanza(); next }
            if ($1 == "Types:") { types = $0; sub(/^Types:[[:space:]]*/, "", types) }
            if ($1 == "URIs:") uri = $2
            if ($1 == "Suites:") { suites = $0; sub(/^Suites:[[:space:]]*/, "", suites) }
            next
        }
        $1 == "deb" { i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ } if (wanted($(i + 1))) { print $i; exit } }
        END { if (deb822 && !done) stanza() }
    ' "${files[@]}"
}
MIRROR=${DEBIAN_MIRROR:-$(apt_uri main)}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-$(apt_uri security)}
[ -n "$MIRROR" ] || { printf 'build.sh: no Debian archive in /etc/apt/sources*: set DEBIAN_MIRROR\n' >&2; exit 64; }
[ -n "$SECURITY_MIRROR" ] || SECURITY_MIRROR="${MIRROR%/debian}/debian-security"
readonly MIRROR SECURITY_MIRROR
readonly REBUILD=${REBUILD:-0} RUNTIME_ONLY=${RUNTIME_ONLY:-0}
# Images carry `org.sandmesh.image=...`, never the bare label key `sandmesh`: containers with
# that label are treated as leaked sandboxes by the janitor hook.
readonly LABEL_KEY=org.sandmesh.image

log() { printf 'build.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
image_id() { docker image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
sha256() { sha256sum | cut -c1-64; }

# --- temp dirs, removed on exit (never through a mount debootstrap may have left behind) ---
tmpdirs=()
cleanup() {
    local d m
    for d in "${tmpdirs[@]}"; do
        [ -d "$d" ] || continue
        while read -r m; do
            umount -l "$m" 2>/dev/null || true
        done < <(awk -v d="$d" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/self/mounts | sort -r)
        rm -rf --one-file-system "$d" || log "warning: could not remove $d"
    done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# mktmp NAME: creates a temp dir, sets $tmp (not a $(...) subshell, so cleanup knows it).
mktmp() { tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/sandmesh-$1.XXXXXX"); tmpdirs+=("$tmp"); }

command -v docker >/dev/null || die "docker not found"
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 || die "the Docker daemon is not reachable"

# One build at a time (parallel test runs may all call this script).
if command -v flock >/dev/null; then
    exec 9>"${XDG_RUNTIME_DIR:-/tmp}/sandmesh-images.lock"
    flock -n 9 || { log "waiting for another build.sh"; flock 9; }
fi

# Classic builder: FROM a local-only image never touches a registry, and the result always
# lands in the local image store.
build_args=(--force-rm)
if [ "$REBUILD" = 1 ]; then build_args+=(--no-cache); fi
if [ -n "${BUILD_NETWORK:-}" ]; then build_args+=(--network "$BUILD_NETWORK"); fi
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    if [ -n "${!v:-}" ]; then build_args+=(--build-arg "$v"); fi
done
docker_build() { DOCKER_BUILDKIT=0 docker build "${build_args[@]}" "$@" >&2; }

# --- 1. base image --------------------------------------------------------------------------
build_base() {
    command -v debootstrap >/dev/null \
        || die "debootstrap not found: apt-get install -y debootstrap (or set BASE_IMAGE=debian:bookworm-slim)"
    [ "$(id -u)" = 0 ] || die "debootstrap needs root (or set BASE_IMAGE=debian:bookworm-slim)"
    local root id t0=$SECONDS
    mktmp rootfs
    root=$tmp
    log "debootstrap --variant=minbase $SUITE $root $MIRROR"
    debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >&2

    log "trimming the root filesystem"
    # Keep later package installs small too (same idea as the official slim images).
    cat >"$root/etc/dpkg/dpkg.cfg.d/sandmesh-nodoc" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
    cat >"$root/etc/apt/apt.conf.d/sandmesh-docker" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb || true"; };
EOF
    cat >"$root/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
EOF
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* \
           "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
           "$root"/usr/share/lintian "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old \
           "$root"/var/log/apt/* "$root"/var/log/*.log
    find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
    # debootstrap copies these from the host; Docker provides its own at run time.
    rm -f "$root/etc/resolv.conf" "$root/etc/hostname"
    install -m 0644 /dev/null "$root/etc/resolv.conf"
    install -m 0644 /dev/null "$root/etc/hostname"

    log "importing $BASE_TAG"
    id=$(tar -C "$root" --numeric-owner --one-file-system \
             --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . \
         | docker import \
             --message "debootstrap --variant=minbase $SUITE $MIRROR" \
             --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
             --change "LABEL $LABEL_KEY=debian-base" \
             --change 'CMD ["bash"]' \
             - )
    docker tag "$id" "$BASE_TAG"
    log "built $BASE_TAG in $((SECONDS - t0))s"
}

if [ -n "${BASE_IMAGE:-}" ]; then
    base_ref=$BASE_IMAGE
    if [ -z "$(image_id "$base_ref")" ]; then
        log "pulling $base_ref"
        docker pull "$base_ref" >&2
    fi
else
    base_ref=$BASE_TAG
    if [ "$REBUILD" = 1 ] || [ -z "$(image_id "$base_ref")" ]; then
        build_base
    fi
fi
base_id=$(image_id "$base_ref")
[ -n "$base_id" ] || die "base image $base_ref not found"

# --- 2. the image (runtime packages, then our binary) ----------------------------------------
dockerfile=$here/$TARGET/Dockerfile
bin_dockerfile=$here/$TARGET/$BIN_DOCKERFILE

# layer_hash NAME FROM: the content hash of the layer NAME/Dockerfile makes on FROM ("base
# <image id>", or another layer's "<name> <hash>"), so a whole chain is named before any of it
# is built.
layer_hash() { { printf 'sandmesh-%s-runtime\n%s\n' "$1" "$2"; cat "$here/$1/Dockerfile"; } | sha256; }
# The AIO image stands on the Chromium layer it shares with the browser image.
from_ref=$base_ref
from_key="base $base_id"
if [ "$TARGET" = aio ]; then
    chromium_hash=$(layer_hash chromium "$from_key")
    from_ref=sandmesh/chromium:${chromium_hash:0:12}
    from_key="chromium $chromium_hash"
fi
rt_hash=$(layer_hash "$TARGET" "$from_key")
rt_ref=$RUNTIME_REPO:${rt_hash:0:12}

ctx=
if [ -n "$BIN" ]; then
    [ -f "$BIN" ] || die "$BIN_VAR=$BIN is not a file"
    # Hash the copy that gets built, not a file that may still be changing.
    mktmp context
    ctx=$tmp
    cp "$bin_dockerfile" "$ctx/Dockerfile"
    install -m 0755 "$BIN" "$ctx/$BIN_NAME"
    # Debug symbols only make the layer big (a debug build is ~13 MB, stripped ~2 MB).
    if command -v strip >/dev/null; then strip --strip-debug "$ctx/$BIN_NAME"; fi
    bin_sha=$(sha256 <"$ctx/$BIN_NAME")
    # "labels runtime": the image names its runtime layer (org.sandmesh.runtime), which
    # template images stand on so that a new binary does not rebuild their packages.
    final_hash=$({ printf 'sandmesh-%s\nruntime %s\n%s %s\nlabels runtime\n' "$TARGET" "$rt_hash" "$BIN_ROLE" "$bin_sha"
                   cat "$bin_dockerfile"; } | sha256)
else
    final_hash=$rt_hash
fi
final_ref=$REPO:${final_hash:0:12}

if [ "$RUNTIME_ONLY" = 1 ] && [ "$REBUILD" != 1 ] && [ -n "$(image_id "$rt_ref")" ]; then
    log "up to date: $rt_ref"
    printf '%s\n' "$rt_ref"
    exit 0
fi
if [ "$REBUILD" != 1 ] && [ -n "$(image_id "$final_ref")" ]; then
    log "up to date: $final_ref"
else
    if [ "$from_ref" != "$base_ref" ] && { [ "$REBUILD" = 1 ] || [ -z "$(image_id "$from_ref")" ]; }; then
        log "building $from_ref from $base_ref"
        t0=$SECONDS
        docker_build --build-arg "BASE_IMAGE=$base_ref" \
            --label "org.sandmesh.hash=${chromium_hash:0:12}" -t "$from_ref" - <"$here/chromium/Dockerfile"
        docker tag "$from_ref" sandmesh/chromium:latest
        log "built $from_ref in $((SECONDS - t0))s"
    fi
    if [ "$REBUILD" = 1 ] || [ -z "$(image_id "$rt_ref")" ]; then
        log "building $rt_ref from $from_ref"
        t0=$SECONDS
        docker_build --build-arg "BASE_IMAGE=$from_ref" \
            --label "org.sandmesh.hash=${rt_hash:0:12}" -t "$rt_ref" - <"$dockerfile"
        log "built $rt_ref in $((SECONDS - t0))s"
    fi
    if [ "$RUNTIME_ONLY" = 1 ]; then
        printf '%s\n' "$rt_ref"
        exit 0
    fi
    if [ -n "$ctx" ]; then
        log "building $final_ref ($BIN_NAME $bin_sha)"
        docker_build --build-arg "RUNTIME_IMAGE=$rt_ref" \
            --label "org.sandmesh.hash=${final_hash:0:12}" --label "org.sandmesh.runtime=$rt_ref" \
            --label "$BIN_LABEL=${bin_sha:0:12}" -t "$final_ref" "$ctx"
    else
        docker tag "$rt_ref" "$final_ref"
    fi
fi
docker tag "$final_ref" "$REPO:latest"
log "$REPO:latest -> $final_ref"
printf '%s\n' "$final_ref"
