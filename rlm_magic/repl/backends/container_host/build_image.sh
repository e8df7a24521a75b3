#!/usr/bin/env bash
# Build the image of RLM.sandbox = "container" locally from Debian's own packages (no
# image registry needed): a minimal Debian with python3 and nothing else; the sandbox's
# worker code is not in it (the kernel sends it at each start). Idempotent: nothing is
# done when the image exists.
#   bash build_image.sh        build with podman, else docker
# Environment: RLM_CONTAINER_RUNTIME (podman or docker), RLM_CONTAINER_IMAGE (default
# localhost/rlm-sandbox), RLM_DEBIAN_SUITE (bookworm), RLM_DEBIAN_MIRROR. Needs root (or
# fakeroot) and debootstrap: apt-get install -y debootstrap podman (or docker.io).
set -euo pipefail

image="${RLM_CONTAINER_IMAGE:-localhost/rlm-sandbox}"
suite="${RLM_DEBIAN_SUITE:-bookworm}"
mirror="${RLM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

runtime="${RLM_CONTAINER_RUNTIME:-}"
if [ -z "$runtime" ]; then
    for candidate in podman docker; do
        # A client whose daemon is down does not count (docker info fails then).
        if command -v "$candidate" >/dev/null && "$candidate" info >/dev/null 2>&1; then
            runtime="$candidate"
            break
        fi
    done
fi
if [ -z "$runtime" ]; then
    echo "no working container runtime: apt-get install -y podman (or docker.io, with dockerd running)" >&2
    exit 1
fi

if "$runtime" image inspect "$image" >/dev/null 2>&1; then
    echo "$image exists ($runtime): nothing to do"
    exit 0
fi
if ! command -v debootstrap >/dev/null; then
    echo "debootstrap is missing: apt-get install -y debootstrap" >&2
    exit 1
fi

rootfs="$(mktemp -d "${TMPDIR:-/tmp}/rlm-rootfs.XXXXXX")"
trap 'rm -rf "$rootfs"' EXIT
# python3, not python3-minimal: the worker needs json, asyncio and the rest of the
# standard library.
debootstrap --variant=minbase --include=python3 "$suite" "$rootfs" "$mirror"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
"$runtime" import --change 'CMD ["/usr/bin/python3"]' - "$image" < <(tar -C "$rootfs" -c .)
echo "built $image ($runtime)"
