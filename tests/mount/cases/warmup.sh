#!/usr/bin/env bash
# ckptfs warmup (issue #12): after a clean umount gave the tier back, the
# files are remote; `ckptfs warmup MNT/step_1` fetches that checkpoint
# (and nothing else) into RAM, byte-exact, and says so; a second warmup has
# nothing to do; with a budget smaller than the checkpoint it warms what
# fits and says what it left; paths outside a ckptfs mount are refused.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

mount_fs --cache-size 256M
for s in 1 2; do
  mkdir "$MNT/step_$s"
  for r in 0 1 2; do
    head -c 4M /dev/urandom > "$T/s${s}r$r"
    cp "$T/s${s}r$r" "$MNT/step_$s/rank$r.pt"
  done
done
umount_fs  # drained and released: every file is remote now

mount_fs --cache-size 256M
expect_eq remote "$(state_of "$MNT/step_1/rank0.pt")" "state after the release"
"$CKPTFS" warmup "$MNT/step_1" > "$T/out" 2> "$T/err" || fail "warmup: $(cat "$T/err")"
note "$(cat "$T/out")"
grep -qF "warmup: 3 files (12.0 MiB) fetched into RAM, 0 were there already" "$T/out" || fail "warmup said: $(cat "$T/out")"
for r in 0 1 2; do
  expect_eq persisted "$(state_of "$MNT/step_1/rank$r.pt")" "state of step_1/rank$r.pt after warmup"
  expect_eq remote "$(state_of "$MNT/step_2/rank$r.pt")" "state of step_2/rank$r.pt (not asked for)"
  cmp "$T/s1r$r" "$MNT/step_1/rank$r.pt" || fail "step_1/rank$r.pt differs after warmup"
done
"$CKPTFS" warmup "$MNT/step_1" > "$T/out" 2> "$T/err" || fail "second warmup: $(cat "$T/err")"
grep -qF "0 files (0 B) fetched into RAM, 3 were there already" "$T/out" || fail "second warmup: $(cat "$T/out")"

# Bad input: one line, exit 1.
for bad in "$T" "$T/no-such-file"; do
  rc=0
  "$CKPTFS" warmup "$bad" > "$T/out" 2> "$T/err" || rc=$?
  expect_eq 1 "$rc" "warmup $bad exit status"
  expect_eq 1 "$(wc -l < "$T/err")" "lines on stderr for warmup $bad ($(cat "$T/err"))"
done
grep -qF "is not in a ckptfs mount" <("$CKPTFS" warmup "$T" 2>&1) || fail "warmup outside a mount: $("$CKPTFS" warmup "$T" 2>&1)"
umount_fs

# A budget smaller than the checkpoint: what fits, and a warning.
mount_fs --cache-size 8M
"$CKPTFS" warmup "$MNT/step_2" > "$T/out" 2> "$T/err" || fail "warmup with a small budget: $(cat "$T/err")"
grep -qF "1 files (4.0 MiB) do not fit the budget" "$T/err" || fail "no budget warning: $(cat "$T/err")"
grep -qF "2 files (8.0 MiB) fetched into RAM" "$T/out" || fail "small budget: $(cat "$T/out")"
grep -qF "1 left remote (no room)" "$T/out" || fail "small budget: $(cat "$T/out")"
for r in 0 1 2; do cmp "$T/s2r$r" "$MNT/step_2/rank$r.pt" || fail "step_2/rank$r.pt differs"; done
umount_fs
check_log
