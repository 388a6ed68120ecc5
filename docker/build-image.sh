#!/usr/bin/env bash
# Build a distlab image: what `make image` (GPU) and `make image-cpu` call.
#
#     docker/build-image.sh gpu|cpu [more build options...]
#
# Settings (environment; empty means the Dockerfile's default):
#   ENGINE         docker (default) or podman
#   IMAGE          tag to build (default distlab:gpu or distlab:cpu)
#   BASE           base image (gpu: an NGC PyTorch tag; cpu: a Debian-based Python image)
#   TORCH_INDEX_URL, TORCH_VERSION, TORCHVISION_VERSION   torch for the cpu image
#   EXTRA_CA       a CA certificate to trust while downloading (TLS-inspecting proxy); passed as
#                  a build secret, never stored in the image. Default: pip's own, $PIP_CERT, if set
#   BUILD_NETWORK  network mode for the build's RUN steps (e.g. host)
#   CACHE_FROM, CACHE_TO   docker buildx layer cache, e.g. type=gha,scope=distlab-cpu (CI); the
#                  image is then loaded into docker's store (--load), as a plain build would leave it
#   DRY_RUN=1      print the build command instead of running it
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR/..
. docker/lib.sh

flavour=${1:-}
case $flavour in
    gpu | cpu) shift ;;
    *) die "say which image: docker/build-image.sh gpu|cpu (or make image / make image-cpu)" ;;
esac
engine=${ENGINE:-docker}
image=${IMAGE:-distlab:$flavour}
extra_ca=${EXTRA_CA:-${PIP_CERT:-}}

cmd=("$engine" build --file "docker/Dockerfile.$flavour" --tag "$image")
# Build arguments only when set, so that the Dockerfile stays the one place with defaults. The
# torch settings (also read by `make setup`) concern the cpu image: the GPU image keeps NGC's torch.
names=(BASE)
[ "$flavour" = gpu ] || names+=(TORCH_INDEX_URL TORCH_VERSION TORCHVISION_VERSION)
for name in "${names[@]}"; do
    if [ -n "${!name:-}" ]; then
        cmd+=(--build-arg "$name=${!name}")
    fi
done
# Provenance for the labels. The repository URL only from GitHub Actions: a local remote URL
# can carry credentials.
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    commit="$commit-dirty"
fi
cmd+=(--build-arg "VCS_REF=$commit" --build-arg "BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)")
if [ -n "${GITHUB_SERVER_URL:-}" ] && [ -n "${GITHUB_REPOSITORY:-}" ]; then
    cmd+=(--build-arg "SOURCE_URL=$GITHUB_SERVER_URL/$GITHUB_REPOSITORY")
fi
if [ -n "$extra_ca" ]; then
    [ -r "$extra_ca" ] || die "EXTRA_CA=$extra_ca is not a readable file; point it at a PEM certificate"
    cmd+=(--secret "id=extra_ca,src=$extra_ca")
fi
if [ -n "${BUILD_NETWORK:-}" ]; then
    cmd+=(--network "$BUILD_NETWORK")
fi
if [ -n "${CACHE_FROM:-}${CACHE_TO:-}" ]; then
    [ "$engine" = docker ] || die "CACHE_FROM/CACHE_TO need docker buildx; unset them for ENGINE=$engine"
    [ -z "${CACHE_FROM:-}" ] || cmd+=(--cache-from "$CACHE_FROM")
    [ -z "${CACHE_TO:-}" ] || cmd+=(--cache-to "$CACHE_TO")
    # A buildx builder other than docker's own keeps the result in its cache unless told to load it.
    cmd+=(--load)
fi
if [ "$engine" = podman ]; then
    # Podman writes OCI images by default, and OCI has no SHELL: the Dockerfiles' bash with
    # pipefail would silently become sh, and a failing step piped into tee would pass.
    cmd+=(--format docker)
fi
cmd+=("$@" .)

if ! dry_run; then
    command -v "$engine" >/dev/null || die "ENGINE=$engine is not installed; install it or use ENGINE=podman"
fi
# Docker needs BuildKit for RUN --mount and --secret (the default since Docker 23).
DOCKER_BUILDKIT=1 run "${cmd[@]}"
