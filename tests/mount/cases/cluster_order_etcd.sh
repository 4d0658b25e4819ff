#!/usr/bin/env bash
# cluster_order.sh with the members' records in etcd (--cluster-store
# etcd://, issue #28): a 3-member etcd on 127.0.0.1, the same three mounts,
# the same ordering, death (b's lease expires), rejoin and leave (c revokes
# its lease).
# serial: measures time (a member timeout, "never appears for N seconds")
# tsan: the etcd store's keep-alive, watch and reduction threads beside the cluster's
CLUSTER_STORE=etcd source "$(dirname "$0")/cluster_order.sh"
