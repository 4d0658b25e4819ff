#!/usr/bin/env bash
# No path goes through a shell. Mount points named m'$(touch pwned)' and
# one mixing a space and both quotes mount, take a write, unmount with
# `ckptfs umount` (and a dead mount of such a name is detached by the next
# mount, also one issued the moment after kill -9), and $T/pwned never
# exists. The source has no system() or popen().
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

# The unit-ish check: no shell in the code.
if grep -rnE '\b(system|popen)\s*\(' "$ROOT/fs" "$ROOT/backend" "$ROOT/cache" "$ROOT/cli" "$ROOT/common" --include='*.cc' --include='*.h'; then
  fail "system()/popen() in the source"
fi

# A name cannot hold a '/': the commands write ./pwned, and we run in $T.
cd "$T"
names=("$T/m'\$(touch pwned)'" "$T/a b\"c'd \$HOME;\`touch pwned\`;'")
i=0
for m in "${names[@]}"; do
  i=$((i + 1))
  mkdir "$m"
  args=(--backend "$BACKEND" --state-dir "$STATE$i" --tier-dir "$TIER-$i" --cache-size 64M)
  _STATE_DIRS+=("$STATE$i")
  _TIER_DIRS+=("$TIER-$i")
  "$CKPTFS" mount "$m" "${args[@]}" > "$T/out" 2>&1 || fail "mount $m: $(cat "$T/out")"
  is_mounted "$m" || fail "$m is not mounted"
  echo "hello $i" > "$m/f"
  "$CKPTFS" umount "$m" > "$T/out" 2>&1 || fail "umount $m: $(cat "$T/out")"
  ! is_mounted "$m" || fail "$m still mounted after ckptfs umount"
  wait_daemon_exit
  expect_eq "hello $i" "$(cat "$BACKEND/f")" "backend copy of f"
  [ ! -e "$T/pwned" ] || fail "a shell ran the mount point's name (umount)"

  # A dead mount of the same name: the next mount detaches it.
  "$CKPTFS" mount "$m" "${args[@]}" > "$T/out" 2>&1 || fail "mount $m again: $(cat "$T/out")"
  for p in $(_our_daemons); do kill -9 "$p"; done
  for _ in $(seq 50); do [ -z "$(_our_daemons)" ] && break; sleep 0.1; done
  "$CKPTFS" mount "$m" "${args[@]}" > "$T/out" 2>&1 || fail "mount over the dead mount $m: $(cat "$T/out")"
  grep -q "detached the dead ckptfs mount" "$T/out" || fail "no detach message: $(cat "$T/out")"
  # Right after kill -9, with no wait: the dying connection answers
  # ECANCELED, then ECONNABORTED, for a few ms before ENOTCONN; the mount
  # waits that out instead of calling it a live mount.
  for p in $(_our_daemons); do kill -9 "$p"; done
  "$CKPTFS" mount "$m" "${args[@]}" > "$T/out" 2>&1 || fail "mount right after kill -9 over $m: $(cat "$T/out")"
  grep -q "detached the dead ckptfs mount" "$T/out" || fail "no detach message right after kill -9: $(cat "$T/out")"
  "$CKPTFS" umount "$m" > "$T/out" 2>&1 || fail "umount $m (2): $(cat "$T/out")"
  wait_daemon_exit
  [ ! -e "$T/pwned" ] || fail "a shell ran the mount point's name (dead-mount detach)"
  rm -f "$BACKEND/f"
done
check_log
