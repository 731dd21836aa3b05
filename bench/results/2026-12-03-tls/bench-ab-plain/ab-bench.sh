#!/usr/bin/env bash
# A/B of the bench binary itself on plaintext: old (HEAD) vs new (working tree), same gateway.
set -euo pipefail
OUT=$1; mkdir -p $OUT
GW=/work/main/target/release/gateway
declare -A BIN=([old]=/tmp/oldws/target/release/bench [new]=/work/main/target/release/bench)
for r in ${ROUNDS:-1 2 3}; do
  if ((r % 2 == 1)); then order=(old new); else order=(new old); fi
  for sc in ${SCS:-batched batch100}; do
    if [[ $sc == batched ]]; then extra="--pipeline-depth 64"; else extra="--batch-events 100 --pipeline-depth 4"; fi
    for side in "${order[@]}"; do
      D=$(mktemp -d /tmp/abb.XXXX)
      taskset -c 0 $GW --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 --connections-per-ip-max 0 --data-dir $D/d --cores 1 --fsync never > $D/log 2>&1 &
      GP=$!
      for _ in $(seq 1 100); do A=$(sed -n 's/.*listening on \([0-9.]*:[0-9]*\).*/\1/p' $D/log | head -1); [[ -n $A ]] && break; sleep 0.1; done
      U=http://$A/v1/streams/{stream}
      echo "$sc $side r$r load $(cut -d' ' -f1 /proc/loadavg)"
      timeout 120 taskset -c 1 ${BIN[$side]} fanout --streams 1 --subscribers-per-stream 100 $extra --payload-bytes 300 --events-per-stream 12000000 --publish-secs-max 6 --publish-url $U/events --publish-batch-url $U/events:batch --subscribe-url $U --target-pid $GP --json > $OUT/$sc-$side.r$r.json || echo "rc $?"
      kill -TERM $GP; wait $GP 2>/dev/null || true; rm -rf $D
    done
  done
done
python3 - $OUT <<'PY'
import json,glob,statistics,sys,collections
d=collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1]+'/*.json')):
    n=f.split('/')[-1]; sc,side=n.split('.')[0].rsplit('-',1)
    r=json.load(open(f))['reports'][-1]
    d[(sc,side)].append((r['delivered_per_sec'], r['bench_cpu_secs']/r['delivered']*1e6, r['server']['cpu_us_per_delivered_event'], r['violations']))
for k,v in sorted(d.items()):
    print(k, 'delivered/s', [round(x[0]) for x in v], 'median', round(statistics.median(x[0] for x in v)),
          '| bench us/ev', [round(x[1],3) for x in v], 'median', round(statistics.median(x[1] for x in v),3),
          '| server us/ev median', round(statistics.median(x[2] for x in v),3), 'viol', sum(x[3] for x in v))
PY
