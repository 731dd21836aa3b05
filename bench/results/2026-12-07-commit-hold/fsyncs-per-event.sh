#!/bin/bash
# fsyncs-per-event.sh HOLD_US: a gateway (BIN, default target/release/gateway) on core 0 with
# --group-commit-hold-us-max HOLD_US, 64 durable publishers (bench durable) on core 1 for 5 s;
# prints the bench row and the counters (events appended, fdatasyncs) from /metrics.
# Run from the repository root.
H=$1; D=$(mktemp -d /tmp/probe.XXXX)
taskset -c 0 ${BIN:-target/release/gateway} --group-commit-hold-us-max $H --listen 127.0.0.1:18080 --admin-listen 127.0.0.1:18081 --connections-per-ip-max 0 --cores 1 --data-dir $D/data >$D/log 2>&1 &
P=$!
sleep 1
taskset -c 1 target/release/bench durable --publish-url "http://127.0.0.1:18080/v1/streams/{stream}/events" --fsync-probes 10 --publishers 64 --secs-per-run 5 --target-pid $P 2>&1 | grep -E "^ +64 \|"
curl -s 127.0.0.1:18081/metrics | grep -E "^gateway_log_fsyncs_total|^gateway_events_appended_total|^gateway_fsync_duration_seconds_(sum|count)"
kill $P; wait $P 2>/dev/null; rm -rf $D
