#!/usr/bin/env bash
# replicas_give_up_across_restart.sh with the holder's note refused too
# (fault replica.note, as on a full tier): the holder keeps the given-up
# replica until its mark is in etcd, and back, reads the names from it.
# serial: kills daemons and waits out their leases
NO_NOTE=1
source "$(dirname "$0")/replicas_give_up_across_restart.sh"
