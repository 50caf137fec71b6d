#!/usr/bin/env bash
# Installs the Debian 12 packages Tessera needs, if any is missing.
set -euo pipefail
pkgs=(cmake ninja-build ccache g++ python3
      llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools
      libopenmpi-dev openmpi-bin libopenblas-dev libgtest-dev
      libflatbuffers-dev flatbuffers-compiler nlohmann-json3-dev
      libonnx-dev libprotobuf-dev
      # The independent PyTorch references of the lit suite (REQUIRES: torch).
      python3-torch python3-numpy)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
