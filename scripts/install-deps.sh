#!/usr/bin/env bash
# Installs the Debian packages ckptfs needs to build, run and test, if any
# are missing. Runs apt-get only when something is missing, so repeated
# `make test` runs stay fast and work offline once set up.
set -euo pipefail

PKGS=(g++ make pkg-config libfuse3-dev fuse3 librocksdb-dev liburing-dev libspdlog-dev libfmt-dev
      libcriterion-dev libxxhash-dev libcurl4-openssl-dev libcli11-dev libpugixml-dev nlohmann-json3-dev
      python3-torch python3-numpy attr util-linux procps)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "ckptfs: installing missing packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
fi
