#!/usr/bin/env bash
# Installs lavapipe, Mesa's Vulkan device on the CPU, for the wgpu device suite
# (crates/spot-models/tests/wgpu.rs): Debian's mesa-vulkan-drivers at the version the suite was
# checked with. Idempotent: does nothing when the driver's ICD file is there. If the archive no
# longer carries the pinned version (a Debian point release replaced it), the archive's version
# is installed and named on stderr, so the run says which driver it tested.
set -euo pipefail
PIN="${LAVAPIPE_VERSION:-22.3.6-1+deb12u1}"
ICD=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json
if [ -e "$ICD" ]; then
    echo "lavapipe: $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || echo '?') ($ICD)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
if apt-cache madison mesa-vulkan-drivers | grep -qF "| $PIN |"; then
    $SUDO apt-get install -y -q --no-install-recommends "mesa-vulkan-drivers=$PIN"
else
    echo "install_lavapipe: mesa-vulkan-drivers $PIN is not in the archive; installing" \
        "$(apt-cache policy mesa-vulkan-drivers | sed -n 's/ *Candidate: //p')" >&2
    $SUDO apt-get install -y -q --no-install-recommends mesa-vulkan-drivers
fi
if [ ! -e "$ICD" ]; then
    echo "install_lavapipe: $ICD missing after installing mesa-vulkan-drivers" >&2
    exit 1
fi
echo "lavapipe: $(dpkg-query -W -f='${Version}' mesa-vulkan-drivers) ($ICD)"
