#!/usr/bin/env bash
# After a kill -9 of the daemon, the log says what happened to each file
# (issue #10, problem b). With the drain stuck, files are written, fsynced
# (--fsync memory) and closed, then the daemon is killed and the same state
# dir remounted. None of them was open when the daemon died, so recovery
# must not log "open for writing when the daemon stopped; back to version
# N" for them: it used to, for every fsync'd-then-closed file not yet
# drained (the fsync's copy of the sealed version was left in the tier and
# taken for the mark of a writer that never closed). A file really held
# open (written after its fsync) must still get that line and come back as
# the fsync'd bytes: the check would otherwise pass by seeing nothing. All
# bytes read back right, and drain once the backend is back.
set -euo pipefail
source "$(dirname "$0")/../lib/common.sh"

WARN="open for writing when the daemon stopped"
touch "$T/pause"
CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 512M
at_exit 'rm -f "$T/pause"'

cat > "$T/writer.py" <<'PY'
import os, sys, time
mnt, refdir, mode = sys.argv[1:4]
MIB = 1 << 20

def put(name, chunks, fsync_after):
    """Writes the chunks, fsync after those whose index is in fsync_after;
    returns the fd (open) and writes the reference of what was written."""
    fd = os.open(os.path.join(mnt, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    data = b""
    for i, c in enumerate(chunks):
        os.write(fd, c)
        data += c
        if i in fsync_after:
            os.fsync(fd)
            with open(os.path.join(refdir, name + ".synced"), "wb") as f:
                f.write(data)
    with open(os.path.join(refdir, name), "wb") as f:
        f.write(data)
    return fd

if mode == "closed":
    # The issue's case: write, fsync, close (three files).
    for i in range(3):
        os.close(put(f"fsync_close_{i}.bin", [os.urandom(8 * MIB)], {0}))
    # Two fsyncs with writes between, then close.
    os.close(put("fsync_twice.bin", [os.urandom(4 * MIB), os.urandom(3 * MIB + 17)], {0, 1}))
    # Written after its fsync, then closed (the close seals the rest).
    os.close(put("fsync_write_close.bin", [os.urandom(4 * MIB), os.urandom(2 * MIB + 5)], {0}))
    # No fsync at all.
    os.close(put("plain_close.bin", [os.urandom(5 * MIB)], set()))
else:
    # Still open when the daemon dies: fsync'd, then written again.
    fd = put("held_open.bin", [os.urandom(4 * MIB), os.urandom(1 * MIB)], {0})
    open(os.path.join(refdir, "ready"), "w").close()
    while True:
        time.sleep(1)
PY
mkdir -p "$T/ref"
timeout -k 5 120 $PY "$T/writer.py" "$MNT" "$T/ref" closed || fail "writer failed"
closed=(fsync_close_0.bin fsync_close_1.bin fsync_close_2.bin fsync_twice.bin fsync_write_close.bin plain_close.bin)
timeout -k 5 120 $PY "$T/writer.py" "$MNT" "$T/ref" open 2> "$T/holder.err" &
holder=$!
at_exit 'kill "$holder" 2>/dev/null'
for _ in $(seq 600); do [ -e "$T/ref/ready" ] || ! kill -0 "$holder" 2>/dev/null && break; sleep 0.1; done
[ -e "$T/ref/ready" ] || fail "the holder did not get its file written: $(cat "$T/holder.err")"
# Not in the backend yet (staged at most: the pause holds the publish).
pending() {
  local s
  s=$(state_of "$MNT/$1")
  case $s in dirty|draining) ;; *) fail "state of $1 $2 (drain paused): '$s', want dirty or draining" ;; esac
}
for f in "${closed[@]}"; do pending "$f" "before the crash"; done

crash_daemon "$holder"

CKPTFS_DRAIN_PAUSE_FILE=$T/pause mount_fs --cache-size 512M
tail -n "+$((CRASH_LOG_LINES + 1))" "$STATE/ckptfs.log" > "$T/recovery.log"
grep -F "$WARN" "$T/recovery.log" > "$T/warned" || true
note "recovery logged: $(cat "$T/warned")"
grep -qF "'held_open.bin': $WARN" "$T/warned" \
  || fail "no '$WARN' line for held_open.bin, the file that was open: the check sees nothing ($(cat "$T/recovery.log"))"
bad=""
for f in "${closed[@]}"; do
  grep -F "'$f': " "$T/warned" >> "$T/bad" && bad+=" $f"
done
[ -z "$bad" ] || fail "recovery says these closed files were open for writing:$bad
$(cat "$T/bad")"

for f in "${closed[@]}"; do
  same_bytes "$T/ref/$f" "$MNT/$f"
  pending "$f" "after the remount"
done
# The open file comes back as what its fsync sealed.
same_bytes "$T/ref/held_open.bin.synced" "$MNT/held_open.bin"

rm -f "$T/pause"
check_backend
for f in "${closed[@]}"; do same_bytes "$T/ref/$f" "$BACKEND/$f"; done
same_bytes "$T/ref/held_open.bin.synced" "$BACKEND/held_open.bin"
umount_fs
check_log --allow-warnings "'held_open.bin': $WARN"
