#!/usr/bin/env bash
# One entry the backend refuses does not wedge the drain (issue #16 item 4).
# It used to be retried for ever: nothing after it drained and `ckptfs
# umount` hung. Now:
#  - the backend's staging name cannot be made through the mount (EPERM);
#  - a path the backend cannot hold (a non-root user nesting 255-byte names
#    in a 1777 directory past PATH_MAX) is refused when made;
#  - a change the backend refuses for good (here a plain file another user
#    put where the drain needs a directory) marks that entry failed —
#    state `failed`, one log line, listed under `failed` in `ckptfs status
#    --json` with its reason — and later checkpoints still drain, in
#    order, and umount completes.
# The shared namespace is off (--shared-ttl 0): with it, the other user's
# file `team` is a name of the shared directory and shows on the mount, so
# mkdir team is EEXIST (docs/consistency.md, "Shared namespace").
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root

mount_fs --cache-size 256M --shared-ttl 0
expect_errno EPERM mkdir "$MNT/.ckptfs-tmp"
chmod 1777 "$MNT"
expect_errno EPERM --as 65534:65534 mkdir "$MNT/.ckptfs-tmp"
chmod 755 "$MNT"
expect_errno EPERM open "$MNT/.ckptfs-probe-1" w,creat
mkdir -m 1777 "$MNT/shared"
long=$(printf 'd%.0s' $(seq 250))
# Relative steps: the absolute path soon passes the kernel's own PATH_MAX.
depth=0
rc=0
cd "$MNT/shared"
while as_nobody mkdir "$long" 2> "$T/mkdir.err"; do cd "$long"; depth=$((depth + 1)); done
grep -q "File name too long" "$T/mkdir.err" || fail "nesting stopped with: $(cat "$T/mkdir.err")"
rel=$(pwd -P)
rel=${rel#"$MNT/"}
cd "$T"
[ "$depth" -ge 10 ] || fail "could nest only $depth dirs"
[ $(( ${#rel} + 251 )) -gt 4095 ] || fail "stopped at ${#rel} bytes, before the backend's limit"
note "nested $depth dirs, ${#rel} bytes; the next one is refused"

# A file where the drain needs a directory: the entries under it fail.
echo "not a dir" > "$BACKEND/team"
mkdir "$MNT/team"
echo "refused" > "$MNT/team/a.pt"
mkdir "$MNT/step_1"
head -c 1M /dev/urandom > "$T/ref"
cp "$T/ref" "$MNT/step_1/model.pt"
echo step_1 > "$MNT/latest"
"$CKPTFS" drain "$MNT" --timeout 60 || fail "the drain did not get past the refused entries"
cmp "$T/ref" "$BACKEND/step_1/model.pt" || fail "step_1 did not reach the backend"
[ "$(cat "$BACKEND/latest")" = step_1 ] || fail "latest did not reach the backend"
[ "$(cat "$BACKEND/team")" = "not a dir" ] || fail "the other user's file was changed"
[ "$(state_of "$MNT/team/a.pt")" = failed ] || fail "team/a.pt state: $(state_of "$MNT/team/a.pt")"
[ "$(cat "$MNT/team/a.pt")" = refused ] || fail "the failed file still reads from memory"
grep -q "refused by backend .* for good" "$STATE/ckptfs.log" || fail "no log line for the failed entry"
"$CKPTFS" status "$MNT" --json > "$T/status.json" || fail "ckptfs status --json failed"
$PY - "$T/status.json" <<'PY' || fail "status does not list team/a.pt as failed: $(cat "$T/status.json")"
import json, sys
f = json.load(open(sys.argv[1]))["failed"]
hit = [e for e in f["first"] if e["path"].lstrip("/") == "team/a.pt"]
assert f["count"] >= 1 and f["count"] >= len(f["first"]) and hit and hit[0]["reason"], f
print("# failed:", f, file=sys.stderr)
PY
# Once the obstacle is gone, a new version drains.
rm "$BACKEND/team"
echo "accepted" > "$MNT/team/a.pt"
"$CKPTFS" drain "$MNT" --timeout 60
umount_fs
# The POSIX backend warns once, with the path, for an entry it refuses for
# good (docs/consistency.md, the permanent errors table).
check_log --allow-errors "refused by backend|mkdir|not a directory|Not a directory|File exists" \
  --allow-warnings "posix backend: .*(is not a directory|File name too long)"
