#!/usr/bin/env bash
# A node restarts on its state dir with its memory tier gone (a reboot, or
# a container restarted with a new /dev/shm) before its files drained, and
# before its lease expired (issue #30: a lost node is not a lost
# checkpoint). Three mounts a, b, c of one job, --replicas 1, etcd; a's
# drain held: a closes its shard of step 1 and a second file, both
# `replicated`; a is killed, its tier removed, and a mounts again at once
# on the same state dir (its record stays live throughout: no holder
# publishes in its place). Before, recovery dropped both files as lost and
# its record's "nothing pending" made the holders drop their replicas:
# the checkpoint was gone though a copy was in a peer's memory. Now a
# reads them back from their holders before it serves: same bytes, not
# listed lost, and they drain to the backend. With the holder of a file
# down as well, a is not mounted and drops nothing; with the holder back,
# it reads the file back. A file no holder has is listed lost, as without
# replicas.
# serial: kills a daemon and mounts it again within its lease
source "$(dirname "$0")/../lib/common.sh"
require_root

# a's lease outlasts its restart; b's and c's (30 s) a stalled keepalive on
# a busy machine, and a holder's restart below
replica_job 30 30

mkdir -p "$A/global_step1"
head -c 5000000 /dev/urandom > "$T/shard_a"
head -c 300000 /dev/urandom > "$T/extra_a"
cp "$T/shard_a" "$A/global_step1/shard_a"
cp "$T/extra_a" "$A/global_step1/extra_a"
is_replicated() { [ "$(state_of "$A/global_step1/$1")" = replicated ]; }
for f in shard_a extra_a; do wait_for 30 "a's $f never became replicated" is_replicated "$f"; done
[ ! -e "$BACKEND/global_step1/shard_a" ] || fail "a's shard drained (a's drain is held)"

kill_node a
rm_tier "$TIER-a"
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout 30 --node a
same_bytes "$T/shard_a" "$A/global_step1/shard_a"
same_bytes "$T/extra_a" "$A/global_step1/extra_a"
expect_eq 0 "$("$CKPTFS" status "$A" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["lost_count"])')" \
  "files a lists lost"
grep -q "read back from its replica on" "$(node_state a)/ckptfs.log" || fail "a's log does not say it read the files back"
rm "$T/pause_a"
"$CKPTFS" drain "$A" > "$T/drain.out" 2>&1 || fail "drain of a: $(cat "$T/drain.out")"
same_bytes "$T/shard_a" "$BACKEND/global_step1/shard_a"
same_bytes "$T/extra_a" "$BACKEND/global_step1/extra_a"
note "a read its 2 files back from their holders after a restart with its tier gone; the backend has them"

# Its holder down too (a holder restarting): nothing is dropped and a is
# not mounted; once the holder is back (its replica store kept beside its
# tier), a mounts and reads the file back.
touch "$T/pause_a"
head -c 700000 /dev/urandom > "$T/more_a"
cp "$T/more_a" "$A/more_a"
is_more() { [ "$(state_of "$A/more_a")" = replicated ]; }
wait_for 30 "a's more_a never became replicated" is_more
holder=""
ino=$(stat -c %i "$A/more_a")  # its replica's name: a.INO.VERSION
for n in b c; do for f in "$TIER-$n-replicas"/a."$ino".[1-9]*; do [ -f "$f" ] && holder=$n; done; done
[ -n "$holder" ] || fail "no holder of a's more_a (a.$ino.*): $(ls "$TIER"-[bc]-replicas)"
kill_node a
rm_tier "$TIER-a"
kill_node "$holder"  # its lease (30 s) keeps its link listed: a must not take it for "no copy"
rc=0
CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a "$CKPTFS" mount "$A" --state-dir "$(node_state a)" --tier-dir "$TIER-a" \
  --cache-size 1G --backend "$BACKEND" "${COMMON[@]}" --member-timeout 30 --node a > "$T/mount-a.out" 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "a mounted with the holder of its file down"
grep -q "did not answer" "$T/mount-a.out" || fail "a's refusal does not say why: $(cat "$T/mount-a.out")"
note "refused while $holder is down: $(tail -1 "$T/mount-a.out")"
mount_node "$holder" -- "${COMMON[@]}" --member-timeout 30 --node "$holder"
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout 30 --node a
same_bytes "$T/more_a" "$A/more_a"
rm "$T/pause_a"
"$CKPTFS" drain "$A" > "$T/drain.out" 2>&1 || fail "drain of a: $(cat "$T/drain.out")"
same_bytes "$T/more_a" "$BACKEND/more_a"
note "with its holder down, a was not mounted and dropped nothing; with the holder back, it read the file back"

# A holder that gives back other bytes than a replicated (its copy changed
# at rest: a tier is a directory root can write; or a member that lies
# under consistent chunk hashes) is not believed: a compares the read-back
# with the checksum it kept when it sent the replica. Its only copy bad,
# the file is listed lost with the reason, not served with those bytes.
# A copy cut short at rest (short_a) is the same: its size other than the
# version's, with the checksum kept, is a mismatch (it was taken for "no
# copy": listed lost for the wrong reason, the bad copy kept).
# a dies right after the holder's second HELD (failpoint replica.held@2):
# each checksum was kept before END went (until stop 70 it was put after
# HELD, and a kill in between left the read-back unchecked).
umount_node a
touch "$T/pause_a"
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" CKPTFS_FAILPOINT=replica.held@2 -- "${COMMON[@]}" \
  --member-timeout 30 --node a
head -c 400000 /dev/urandom > "$T/bad_a"
head -c 350000 /dev/urandom > "$T/short_a"
cp "$T/bad_a" "$A/bad_a"
cp "$T/short_a" "$A/short_a" || true # a may die at the failpoint before cp's last call returns
a_died() { [ -z "$(_node_pid a)" ]; }
wait_for 30 "a did not die at the failpoint replica.held" a_died
grep -q "failpoint replica.held reached" "$(node_state a)/ckptfs.log" || fail "a died, not at replica.held"
declare -A copy ino
for name in bad_a short_a; do # the holder's copy: a.INO.VERSION, the only one of its size
  for n in b c; do for f in "$TIER-$n-replicas"/a.*.[1-9]*; do
    case "$f" in *.meta) ;; *) [ -f "$f" ] && [ "$(stat -c %s "$f")" = "$(stat -c %s "$T/$name")" ] && copy[$name]=$f ;; esac
  done; done
  [ -n "${copy[$name]:-}" ] || fail "no holder's copy of a's $name: $(ls -l "$TIER"-[bc]-replicas)"
  ino[$name]=$(basename "${copy[$name]}" | cut -d. -f2)
done
printf 'XXXXXXXX' | dd of="${copy[bad_a]}" bs=1 seek=1000 conv=notrunc status=none
truncate -s 300000 "${copy[short_a]}"
rm_tier "$TIER-a"
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout 30 --node a
"$CKPTFS" lost "$A" > "$T/lost.out" || fail "ckptfs lost"
for name in bad_a short_a; do
  [ ! -e "$A/$name" ] || fail "a took the holder's changed bytes for its $name (cmp: $(cmp "$T/$name" "$A/$name" 2>&1))"
  # Told to drop it while a mounted (before a's record says the file is
  # gone, which would make the holder drop it a few seconds later anyway).
  [ ! -e "${copy[$name]}" ] || fail "the holder kept its changed copy of $name (${copy[$name]}): a re-send would count it"
  grep -q "$name" "$T/lost.out" || fail "a does not list $name lost: $(cat "$T/lost.out")"
  grep -q "ino ${ino[$name]} '$name': the bytes read back from .* are not the ones this node replicated" \
    "$(node_state a)/ckptfs.log" || fail "a's log does not name $name's mismatch"
  grep -q "ino ${ino[$name]} '$name': lost (.*checksum mismatch)" "$(node_state a)/ckptfs.log" ||
    fail "a's log does not give the mismatch as the reason $name is lost"
done
"$CKPTFS" lost "$A" --clear > /dev/null
rm "$T/pause_a"
note "holders' copies changed or cut short at rest were refused by their checksum and dropped: listed lost, not served"

# With no holder (b and c gone before a's file was replicated), the same
# restart lists the file lost, as without replicas.
for n in b c; do umount_node "$n"; done
touch "$T/pause_a"
echo alone > "$A/alone"
kill_node a
rm_tier "$TIER-a"
mount_node a "CKPTFS_DRAIN_PAUSE_FILE=$T/pause_a" -- "${COMMON[@]}" --member-timeout 30 --node a
[ ! -e "$A/alone" ] || fail "a file no holder had is back"
"$CKPTFS" lost "$A" > "$T/lost.out" || fail "ckptfs lost"
grep -q "alone" "$T/lost.out" || fail "a does not list its unreplicated file lost: $(cat "$T/lost.out")"
"$CKPTFS" lost "$A" --clear > /dev/null
rm "$T/pause_a"
umount_node a
check_log --allow-errors "lost|did not answer|not the ones this node replicated|failpoint replica.held" --allow-warnings "replicas:|replica link|etcd|lease|not in the memory tier|read back|lost"
echo "PASS: $CASE"
