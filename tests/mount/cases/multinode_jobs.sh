#!/usr/bin/env bash
# Many nodes, one checkpoint directory (issue #11): four mounts a..d over
# one backend, each with its own state and tier dirs, `--cluster job` and
# the shared namespace (default --shared-ttl 1). A DeepSpeed-style job
# (global_stepN/ shards from every rank, a barrier, rank 0's `latest`,
# rotation of old steps by rank 0) and a Megatron-style one
# (iter_000000N/mp_rank_XX/ from every rank, rank 0's
# latest_checkpointed_iteration.txt), ranks as processes, rank r on node r,
# node b's drain slowed. While they run, a watcher checks the backend every
# 10 ms: `latest` and the tracker never name a step missing a rank's shard.
# Then every rank resumes on its own node — reads `latest`/the tracker and
# torch.loads its own shard of that step — and all agree, with the right
# bytes: after the job, after a clean restart of every node (tiers given
# back: everything is fetched from the backend), and after kill -9 of
# node c's daemon in the middle of a job (c mounted again rejoins), and on
# a fresh fifth node (new state dir: the job restarted elsewhere). Rank
# 0's rotation removes every node's shards of old steps from the backend
# and from every node's view.
# serial: four daemons, a slowed drain and a watcher that race the ranks by the clock
source "$(dirname "$0")/../lib/common.sh"
$PY -c 'import torch' 2>/dev/null || skip "$PY has no torch"

NODES=(a b c d)
COMMON=(--cluster job --member-timeout 30 --cache-size 512M)
if [ "${CLUSTER_STORE:-}" = etcd ]; then  # multinode_jobs_etcd.sh: the records in a 3-member etcd
  start_etcd 3
  EPS=$ETCD_EPS
  COMMON+=(--cluster-store "etcd://$EPS")
fi
for n in "${NODES[@]}"; do
  PROM=()  # with etcd: the turns given and the batons handed on (noted after the jobs)
  [ "${CLUSTER_STORE:-}" = etcd ] && PROM=(--metrics-textfile "$T/$n.prom")
  if [ "$n" = b ]; then
    mount_node "$n" CKPTFS_DRAIN_DELAY_MS=150 -- "${COMMON[@]}" --node "$n" "${PROM[@]}"
  else
    mount_node "$n" -- "${COMMON[@]}" --node "$n" "${PROM[@]}"
  fi
done
MNTS=()
for n in "${NODES[@]}"; do MNTS+=("$(node_mnt "$n")"); done

cat > "$T/job.py" <<'PY'
# job.py STYLE FIRST_STEP LAST_STEP BARRIER_DIR MNT0 MNT1 MNT2 MNT3
# Ranks as processes (fork after importing torch once); rank r saves into
# the mount of node r. STYLE: deepspeed or megatron.
import multiprocessing as mp, os, shutil, sys, time, torch
style, first, last, bar = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
mnts = sys.argv[5:]
N = len(mnts)

def shard(step, rank):
    g = torch.Generator().manual_seed(step * 100 + rank)
    return {"w": torch.randn(256, 1024, generator=g), "step": step, "rank": rank}

def paths(step, rank):
    if style == "deepspeed":
        d = f"global_step{step}"
        return d, f"{d}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
    d = f"iter_{step:07d}"
    return d, f"{d}/mp_rank_{rank:02d}/model_optim_rng.pt"

PAUSE = float(os.environ.get("JOB_PAUSE", "0"))  # seconds between steps
def barrier(name, rank):
    open(os.path.join(bar, f"{name}.{rank}"), "w").close()
    deadline = time.time() + float(os.environ.get("JOB_BARRIER_TIMEOUT", "120"))
    while not all(os.path.exists(os.path.join(bar, f"{name}.{r}")) for r in range(N)):
        if time.time() > deadline:
            raise SystemExit(f"rank {rank}: barrier {name} timed out")
        time.sleep(0.005)

def rank_main(rank):
    m = mnts[rank]
    for step in range(first, last + 1):
        d, p = paths(step, rank)
        os.makedirs(os.path.join(m, os.path.dirname(p)), exist_ok=True)
        torch.save(shard(step, rank), os.path.join(m, p))
        if rank == 0 and style == "deepspeed":
            torch.save({"module": shard(step, 99)}, os.path.join(m, d, "mp_rank_00_model_states.pt"))
        barrier(f"{style}-{step}", rank)  # every shard of the step is closed
        # Nothing between the barrier and `latest`: a rank's close, its barrier
        # file and rank 0's `latest` can fit in one millisecond here, and the
        # ordering margin is the gate times' resolution, 1 µs
        # (docs/consistency.md; in ms, `latest` passed a shard 2 runs of 9).
        # JOB_GAP=S waits S seconds.
        time.sleep(float(os.environ.get("JOB_GAP", "0")))
        if rank == 0:
            if style == "deepspeed":
                with open(os.path.join(m, "latest"), "w") as f:
                    f.write(f"global_step{step}")
            else:
                with open(os.path.join(m, "latest_checkpointed_iteration.txt"), "w") as f:
                    f.write(str(step))
            old = step - 2  # keep the last two, as the frameworks' rotation does
            if old >= 1 and os.path.exists(os.path.join(m, paths(old, 0)[0])):  # not rotated already
                od, _ = paths(old, 0)
                # The other ranks' shards of that step are on other nodes:
                # this node sees them once they are persisted (shared
                # namespace); wait until it sees all, then remove the step.
                deadline = time.time() + 60
                while True:
                    seen = [os.path.exists(os.path.join(m, paths(old, r)[1])) for r in range(N)]
                    if all(seen) or time.time() > deadline:
                        break
                    time.sleep(0.05)
                assert all(seen), f"rank 0 never saw every shard of step {old}: {seen}"
                shutil.rmtree(os.path.join(m, od))
        barrier(f"{style}-{step}-done", rank)
        time.sleep(PAUSE)

if __name__ == "__main__":
    os.makedirs(bar, exist_ok=True)
    mp.set_start_method("fork")
    procs = [mp.Process(target=rank_main, args=(r,)) for r in range(N)]
    for p in procs: p.start()
    for p in procs: p.join()
    bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise SystemExit(f"ranks {bad} failed")
PY

cat > "$T/resume.py" <<'PY'
# resume.py STYLE WANT_STEP MNT0..MNT3: every rank, on its own node, reads
# the tracker and loads its shard of that step: all must agree on WANT_STEP.
import os, sys, time, torch
style, want = sys.argv[1], int(sys.argv[2])
mnts = sys.argv[3:]
for rank, m in enumerate(mnts):
    tracker = "latest" if style == "deepspeed" else "latest_checkpointed_iteration.txt"
    deadline = time.time() + 10  # another node's rewrite is visible within a TTL (1 s)
    while True:
        try:
            text = open(os.path.join(m, tracker)).read().strip()
            step = int(text.removeprefix("global_step"))
        except FileNotFoundError:
            step = None
        if step == want or time.time() > deadline:
            break
        time.sleep(0.1)
    assert step == want, f"rank {rank} on {m} resumes from {step}, not {want}"
    p = f"global_step{step}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" if style == "deepspeed" \
        else f"iter_{step:07d}/mp_rank_{rank:02d}/model_optim_rng.pt"
    sd = torch.load(os.path.join(m, p))
    g = torch.Generator().manual_seed(step * 100 + rank)
    assert sd["step"] == step and sd["rank"] == rank and torch.equal(sd["w"], torch.randn(256, 1024, generator=g)), \
        f"rank {rank}: wrong shard in {p}"
print(f"{style}: every rank resumes from step {want}")
PY

cat > "$T/watch.py" <<'PY'
# watch.py BACKEND STOPFILE: until STOPFILE exists, every 10 ms: the steps
# `latest` and the tracker name have every rank's shard in the backend.
import os, sys, time
root, stop = sys.argv[1:3]
N, checks, named = 4, 0, set()
def need(tracker, text):
    if tracker == "latest":
        d = text
        return [f"{d}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(N)] + [f"{d}/mp_rank_00_model_states.pt"]
    s = int(text)
    return [f"iter_{s:07d}/mp_rank_{r:02d}/model_optim_rng.pt" for r in range(N)]
while not os.path.exists(stop):
    for tracker in ("latest", "latest_checkpointed_iteration.txt"):
        try:
            text = open(os.path.join(root, tracker)).read().strip()
        except FileNotFoundError:
            continue
        if not text:
            continue
        missing = [p for p in need(tracker, text) if not os.path.exists(os.path.join(root, p))]
        # A later step may have been rotated away by the time we look: only
        # a tracker that still says the same after the check counts.
        try:
            again = open(os.path.join(root, tracker)).read().strip()
        except FileNotFoundError:
            again = None
        if missing and again == text:
            print(f"VIOLATION: backend {tracker} = {text} but missing {missing}", flush=True)
            sys.exit(1)
        checks += 1
        named.add((tracker, text))
    time.sleep(0.01)
print(f"watcher: {checks} checks, trackers seen: {sorted(named)}")
PY

start_watch() { rm -f "$T/stop"; $PY "$T/watch.py" "$BACKEND" "$T/stop" > "$T/watch.out" 2>&1 & WATCH=$!; }
stop_watch() {
  touch "$T/stop"
  wait "$WATCH" || { cat "$T/watch.out" >&2; fail "the backend named an incomplete step"; }
  cat "$T/watch.out" >&2
}
drain_all() { for m in "${MNTS[@]}"; do "$CKPTFS" drain "$m" --timeout 120 > /dev/null || fail "drain $m"; done; }

# 1. Both jobs, 4 steps each, under the watcher; then every rank resumes.
start_watch
$PY "$T/job.py" deepspeed 1 4 "$T/bar" "${MNTS[@]}"
$PY "$T/job.py" megatron 1 4 "$T/bar" "${MNTS[@]}"
drain_all
stop_watch
$PY "$T/resume.py" deepspeed 4 "${MNTS[@]}"
$PY "$T/resume.py" megatron 4 "${MNTS[@]}"
# Rotation from rank 0 removed every node's shards of steps 1 and 2.
for s in 1 2; do
  [ ! -e "$BACKEND/global_step$s" ] || fail "global_step$s still in the backend after rank 0's rotation"
  [ ! -e "$BACKEND/iter_000000$s" ] || fail "iter_000000$s still in the backend"
done
sleep 1.5  # one TTL: the clean copies on the other nodes follow the backend
for m in "${MNTS[@]}"; do
  for s in 1 2; do [ ! -e "$m/global_step$s" ] || fail "$m still shows global_step$s"; done
  [ -e "$m/global_step4" ] && [ -e "$m/iter_0000004" ] || fail "$m does not show the kept steps"
done

if [ "${CLUSTER_STORE:-}" = etcd ]; then
  sleep 5.5  # the metrics file is written every 5 s
  turns=0 batons=0
  for n in "${NODES[@]}"; do
    turns=$((turns + $(awk '$1 == "ckptfs_cluster_turns_total" {print int($2)}' "$T/$n.prom")))
    batons=$((batons + $(awk '$1 == "ckptfs_cluster_batons_handed_total" {print int($2)}' "$T/$n.prom")))
  done
  note "8 checkpoints on 4 nodes: $turns turns given by the elected member, $batons batons handed on"
fi

# 2. A clean restart of every node: the tiers are given back, every shard is
#    fetched from the backend.
for n in "${NODES[@]}"; do umount_node "$n"; done
for n in "${NODES[@]}"; do mount_node "$n" -- "${COMMON[@]}" --node "$n"; done
$PY "$T/resume.py" deepspeed 4 "${MNTS[@]}"
$PY "$T/resume.py" megatron 4 "${MNTS[@]}"

# 3. kill -9 of node c's daemon in the middle of a job (c's rank stops with
#    an I/O error, so the job fails), c mounted again with the same state
#    dir (it rejoins), the job run again from step 5: every rank resumes
#    from step 6, and the backend never named an incomplete step.
start_watch
JOB_PAUSE=2 JOB_BARRIER_TIMEOUT=10 $PY "$T/job.py" deepspeed 5 6 "$T/bar2" "${MNTS[@]}" > "$T/job3.out" 2>&1 &
JOB=$!
sleep 2
kill_node c
wait "$JOB" && note "the job finished before the kill"
mount_node c -- "${COMMON[@]}" --node c
rm -rf "$T/bar2"
$PY "$T/job.py" deepspeed 5 6 "$T/bar2" "${MNTS[@]}"
drain_all
stop_watch
$PY "$T/resume.py" deepspeed 6 "${MNTS[@]}"
for n in "${NODES[@]}"; do umount_node "$n"; done

# 4. The job restarted on another node: a fresh mount (new state dir, new
#    tier) joins the cluster, imports the backend as remote, and every rank
#    resumes there from the backend.
mount_node e -- "${COMMON[@]}" --node e
E=$(node_mnt e)
$PY "$T/resume.py" deepspeed 6 "$E" "$E" "$E" "$E"
$PY "$T/resume.py" megatron 4 "$E" "$E" "$E" "$E"
umount_node e
check_log --allow-errors 'cluster|I/O error|Input/output' --allow-warnings '.'
echo "PASS: $CASE"
