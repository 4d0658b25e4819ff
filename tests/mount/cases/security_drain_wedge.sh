#!/usr/bin/env bash
# One entry the backend refuses does not wedge the drain (issue #16 item 4).
# It used to be retried for ever: nothing after it drained and `ckptfs
# umount` hung. Now:
#  - the backend's staging name cannot be made through the mount (EPERM);
#  - a non-root user nesting 255-byte names in a 1777 directory past
#    PATH_MAX makes a tree the backend holds (no wedge to make);
#  - a change the backend refuses for good (here a plain file another user
#    put in the backend where the drain needs a directory) holds the drain
#    (order first: `latest` waits) with `ckptfs drain` naming it, until the
#    operator skips it: then that entry is failed — state `failed`, one log
#    line, listed under `failed` in `ckptfs status --json` with its reason —
#    and later checkpoints drain, in order, and umount completes.
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
# A non-root user nests 255-byte names past PATH_MAX (the backend holds
# any depth: it resolves long paths in pieces), in relative steps: the
# absolute path soon passes the kernel's own PATH_MAX. It drains like any
# other tree and holds nobody's drain.
depth=0
cd "$MNT/shared"
while [ "$depth" -lt 20 ]; do as_nobody mkdir "$long" || fail "nesting stopped at depth $depth"; cd "$long"; depth=$((depth + 1)); done
as_nobody sh -c 'echo deep > f' || fail "a file at depth $depth"
cd "$T"
note "nested $depth dirs, $((depth * 251)) bytes"

# A file where the drain needs a directory: the entries under it fail.
echo "not a dir" > "$BACKEND/team"
mkdir "$MNT/team"
echo "refused" > "$MNT/team/a.pt"
mkdir "$MNT/step_1"
head -c 1M /dev/urandom > "$T/ref"
cp "$T/ref" "$MNT/step_1/model.pt"
echo step_1 > "$MNT/latest"
# The drain holds at the refused mkdir (order first): nothing after it
# reaches the backend until the operator fixes the backend or skips it.
if "$CKPTFS" drain "$MNT" --timeout 60 2> "$T/drain.err"; then fail "drain exited 0 past a refused entry"; fi
grep -q "holds at team" "$T/drain.err" || fail "drain did not name the held entry: $(cat "$T/drain.err")"
[ ! -e "$BACKEND/latest" ] || fail "latest reached the backend past a refused entry"
# The operator gives up on the two refused entries, one at a time.
"$CKPTFS" skip "$MNT" team > /dev/null || fail "skip team"
for _ in $(seq 100); do [ -n "$("$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; h=json.load(sys.stdin)["drain"]["held"]; print(h["path"] if h and h["path"] == "team/a.pt" else "")')" ] && break; sleep 0.1; done
"$CKPTFS" skip "$MNT" team/a.pt > /dev/null || fail "skip team/a.pt"
if "$CKPTFS" drain "$MNT" --timeout 60 2> "$T/drain.err"; then fail "drain exited 0 with failed entries"; fi
grep -q "failed: team/a.pt: skipped by the operator" "$T/drain.err" || fail "drain did not name the failed file: $(cat "$T/drain.err")"
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
"$CKPTFS" lost "$MNT" --clear > /dev/null
"$CKPTFS" drain "$MNT" --timeout 60 2> "$T/drain.err" || fail "drain after the fix: $(cat "$T/drain.err")"
$PY - "$BACKEND/shared" "$long" 20 <<'PY' || fail "the deep file did not reach the backend"
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
for _ in range(int(sys.argv[3])):  # step by step: the whole path is past PATH_MAX
    fd = os.open(sys.argv[2], os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
assert os.read(os.open("f", os.O_RDONLY, dir_fd=fd), 100) == b"deep\n"
PY
umount_fs
# The POSIX backend warns once, with the path, for an entry it refuses for
# good (docs/consistency.md, the permanent errors table).
check_log --allow-errors "refused by backend|mkdir|not a directory|Not a directory|File exists" \
  --allow-warnings "posix backend: .*(is not a directory|File name too long|in the way)|skip: the operator"
