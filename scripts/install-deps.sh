#!/usr/bin/env bash
# Installs the Debian packages ckptfs needs to build, run and test, if any
# are missing. Runs apt-get only when something is missing, so repeated
# `make test` runs stay fast and work offline once set up.
#
# With arguments, installs just those Debian packages if missing, and nothing
# else: `make analyze` brings its compiler (clang-16) this way, so make test
# never waits for it.
set -euo pipefail

PKGS=(g++ make pkg-config libfuse3-dev fuse3 librocksdb-dev liburing-dev libspdlog-dev libfmt-dev
      libcriterion-dev libxxhash-dev libcurl4-openssl-dev libcli11-dev libpugixml-dev nlohmann-json3-dev
      libmicrohttpd-dev libmount-dev etcd-server etcd-client libucx-dev ucx-utils
      libssl-dev python3-torch python3-numpy attr util-linux procps)

missing=()
# node and npm run the S3 test server (s3rver); any node >= 18 will do, so a
# nodesource build already on the machine is kept.
if (($#)); then
  PKGS=("$@")
elif ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  PKGS+=(nodejs npm)
fi
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

if (($#)); then exit 0; fi

# The S3-compatible test server, from the npm registry, into the repo only.
here=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -d "$here/tests/s3/node/node_modules/s3rver" ]; then
  echo "ckptfs: installing s3rver (npm) into tests/s3/node"
  npm install --prefix "$here/tests/s3/node" --no-audit --no-fund --loglevel=error </dev/null
fi
