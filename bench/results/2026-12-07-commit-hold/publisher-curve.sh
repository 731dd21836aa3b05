#!/bin/bash
# publisher-curve.sh BIN: the durable publisher curve (PUBS, default 1,2,...,64; SECS each,
# default 3), gateway BIN on core 0 with its default flags plus any in EXTRA, bench on core 1.
# Run from the repository root. Without the hold: EXTRA='--group-commit-hold-us-max 0'.
B=$1; D=$(mktemp -d /tmp/curve.XXXX)
taskset -c 0 $B ${EXTRA:-} --listen 127.0.0.1:18090 --admin-listen 127.0.0.1:18091 --connections-per-ip-max 0 --cores 1 --data-dir $D/data >$D/log 2>&1 &
P=$!; sleep 1
taskset -c 1 target/release/bench durable --publish-url "http://127.0.0.1:18090/v1/streams/{stream}/events" --fsync-probes 500 --fsync-probe-cpus 0 --publishers ${PUBS:-1,2,4,8,16,32,64} --secs-per-run ${SECS:-3} --target-pid $P 2>&1 | grep -E "^ +[0-9]+ \||raw"
kill $P; wait $P 2>/dev/null; rm -rf $D
