#!/usr/bin/env bash
# Issue #16 item 1: another user who can write to the backend directory
# replaces a directory ckptfs drained (team/) with a symlink to a root-only
# directory. The daemon (root) must never follow it: the victim directory is
# untouched, the refusal is logged with the path, the daemon stays up, and
# the drain holds at the refused entry (order first: later entries outside
# team/ wait), and (EXPECT_CONTINUE=1) with -o on_refusal=skip they reach
# the backend. EXPECT_CONTINUE=0 checks only the refusal and the hold.
# The shared namespace is off (--shared-ttl 0): with it, the planted symlink
# shows on the mount once the TTL passes (docs/consistency.md, "Shared
# namespace"), and `echo > $MNT/team/b` would follow it in the shell's own
# rights, not the daemon's: on a busy CI machine more than 1 s passed
# between the plant and the write, and the case saw no refused entry.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"
require_root
EXPECT_CONTINUE=${EXPECT_CONTINUE:-1}

mount_fs --shared-ttl 0
mkdir "$MNT/team"
echo "first" > "$MNT/team/a"
"$CKPTFS" drain "$MNT" --timeout 60
[ "$(cat "$BACKEND/team/a")" = first ] || fail "team/a did not drain"

# A root-only directory the attacker wants the daemon to write into.
VICTIM=$T/victim
mkdir -m 0700 "$VICTIM"
echo secret > "$VICTIM/a"
chmod 0600 "$VICTIM/a"
snapshot() { (cd "$VICTIM" && find . -printf '%p %m %u %s\n' | sort && { cat a 2>&1 || true; }); }
snapshot > "$T/victim.before"

# The backend is a shared team directory: anyone may write to it.
chmod 0777 "$BACKEND"
as_nobody mv "$BACKEND/team" "$BACKEND/team.old"
as_nobody ln -s "$VICTIM" "$BACKEND/team"
[ -L "$BACKEND/team" ] || fail "could not plant the symlink"

echo "second" > "$MNT/team/b"
chmod 0666 "$MNT/team/a"
mkdir "$MNT/team/sub"
rm "$MNT/team/a"
mkdir "$MNT/other"
echo "later" > "$MNT/other/c"

# The drain holds at the first refused entry (-o on_refusal=hold, the
# default: order first), so other/c, logged after it, waits in RAM.
held() { "$CKPTFS" status "$MNT" --json | $PY -c 'import json,sys; h=json.load(sys.stdin)["drain"]["held"]; print(h["path"] if h else "")'; }
for _ in $(seq 100); do [ -n "$(held)" ] && break; sleep 0.1; done
case $(held) in team/*) ;; *) fail "the drain does not hold at the refused team/ entry: '$(held)'" ;; esac
[ ! -e "$BACKEND/other/c" ] || fail "other/c reached the backend past a refused entry"
if [ "$EXPECT_CONTINUE" = 1 ]; then
  # -o on_refusal=skip: the refused entries fail and the drain goes on.
  "$CKPTFS" umount "$MNT" --no-drain > "$T/umount.out" 2>&1 || { cat "$T/umount.out" >&2; fail "umount"; }
  wait_daemon_exit
  mount_fs --shared-ttl 0 -o on_refusal=skip
  for _ in $(seq 100); do
    [ -f "$BACKEND/other/c" ] && break
    sleep 0.3
  done
  [ "$(cat "$BACKEND/other/c" 2>/dev/null)" = later ] \
    || fail "other/c did not reach the backend within 30 s with -o on_refusal=skip"
else
  sleep 5
fi

snapshot > "$T/victim.after"
diff "$T/victim.before" "$T/victim.after" || fail "the root-only victim directory was changed through the symlink"
[ -L "$BACKEND/team" ] || fail "the planted symlink itself was replaced"
stat "$MNT" > /dev/null || fail "daemon died"
"$CKPTFS" status "$MNT" > /dev/null || fail "status failed"
grep -E "posix backend: .*team.*(symlink|ELOOP|Too many levels)" "$STATE/ckptfs.log" > /dev/null \
  || fail "the refusal was not logged with the path"

# The drain may still hold the refused entries: unmount without draining.
"$CKPTFS" umount "$MNT" --no-drain > "$T/umount.out" 2>&1 || { cat "$T/umount.out" >&2; fail "umount"; }
wait_daemon_exit
snapshot > "$T/victim.after"
diff "$T/victim.before" "$T/victim.after" || fail "victim changed by the end"
check_log --allow-errors "drain: |posix backend: " --allow-warnings "posix backend: |drain: "
