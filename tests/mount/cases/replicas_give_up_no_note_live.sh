#!/usr/bin/env bash
# replicas_give_up_no_note.sh without the holder's stop: it keeps the
# given-up replica (no note, no mark) without deciding it again each pass,
# and drops it once its marks go in.
# serial: kills a daemon and waits out its lease
NO_NOTE=1
LIVE=1
source "$(dirname "$0")/replicas_give_up_across_restart.sh"
