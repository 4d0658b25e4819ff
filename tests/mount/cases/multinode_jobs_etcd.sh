#!/usr/bin/env bash
# multinode_jobs.sh with the members' records in a 3-member etcd
# (--cluster-store, issue #28): the same DeepSpeed- and Megatron-style jobs
# on four nodes, the watcher of `latest`, the resumes, the kill -9 of node
# c and the fresh fifth node.
# serial: four daemons, a slowed drain and a watcher that race the ranks by the clock
CLUSTER_STORE=etcd source "$(dirname "$0")/multinode_jobs.sh"
