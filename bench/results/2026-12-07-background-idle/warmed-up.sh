#!/bin/bash
# steady.sh BIN: gateway on core 0 (--fsync never), a 6 s warm-up run of 100x1 plain, then a measured 5 s run
D=$(mktemp -d /tmp/st.XXXX)
taskset -c 0 $1 --listen 127.0.0.1:18100 --admin-listen 127.0.0.1:18101 --connections-per-ip-max 0 --cores 1 --fsync never --connections-max 200000 >$D/log 2>&1 &
P=$!; sleep 2
U="http://127.0.0.1:18100/v1/streams/{stream}"
run() { taskset -c 1 /work/main/target/release/bench fanout --streams 100 --subscribers-per-stream 1 --events-per-stream 10000000 --publishers 4 --publish-secs-max $1 --pipeline-depth 1 --payload-bytes 256 --publish-url "$U/events" --publish-batch-url "$U/events:batch" --subscribe-url "$U" --publish-style gateway --id-style gateway --target-pid $P 2>&1 | grep -E "latency|delivered events"; }
run 6 > /dev/null
run 5
kill $P; wait $P 2>/dev/null; rm -rf $D
