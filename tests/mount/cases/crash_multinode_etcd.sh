#!/usr/bin/env bash
# crash_multinode.sh with the members' records in a 3-member etcd
# (--cluster-store, issue #28): kill -9 of a random node's daemon, its
# remount under a new lease, P1-P3 (latest never names a step missing a
# shard of any rank). CRASH_SEED=S runs that seed.
# serial: kill points and the slowed drain race the writers by the clock
CLUSTER_STORE=etcd source "$(dirname "$0")/crash_multinode.sh"
