#!/usr/bin/env bash
# Install a container runtime from Debian's packages and build the image of
# RLM.sandbox = "container" (rlm_magic/repl/backends/container_host/build_image.sh), so its tests run for real.
# CI runs this in the background while the guardrails run; where it cannot (not root,
# no apt), the container tests skip and say why.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "not root with apt-get: no container runtime is installed" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # runc: crun refuses a machine whose cgroups are v1 and v2 at once (seen here).
    apt-get install -y -qq --no-install-recommends podman runc debootstrap uidmap >/dev/null
fi
bash rlm_magic/repl/backends/container_host/build_image.sh
