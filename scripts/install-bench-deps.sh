#!/usr/bin/env bash
# Installs the Debian packages only `make bench` needs (tests/bench), if any
# are missing: rclone (the FUSE peer), python3-matplotlib (the chart),
# awscli (the S3 drain benchmark's client), plus the tools run.sh calls.
# Like scripts/install-deps.sh, apt-get runs only when something is missing.
set -euo pipefail

PKGS=(rclone python3-matplotlib awscli python3-torch python3-numpy fuse3 procps coreutils util-linux)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "ckptfs bench: installing missing packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
fi
