#!/usr/bin/env python3
"""mcp-stream-rate.py HOST PORT COUNT REPS: one MCP session (2025-11-25) on the gateway at
HOST:PORT whose upstream is gateway/tests/mcp_upstream.awk; REPS times a tools/call of tool
`p` with COUNT progress notifications and no interval, read to its end over SSE. Prints the
median time to the first progress notification and the median records/s of one stream
(progress notifications over the call's whole time). Plain blocking http.client; every read
has a 60 s timeout. Used by scripts/bench-mcp-cluster.sh."""
import http.client, json, sys, time
host, port = sys.argv[1], int(sys.argv[2]); count = int(sys.argv[3]); reps = int(sys.argv[4])
ACC = "application/json, text/event-stream"
def req(method, body, headers):
    c = http.client.HTTPConnection(host, port, timeout=60)
    h = {"Accept": ACC, "Content-Type": "application/json"}; h.update(headers)
    c.request(method, "/mcp", body=body, headers=h)
    return c, c.getresponse()
def events(r):
    buf = b""
    while True:
        line = r.fp.readline()
        if not line: return
        if line in (b"\n", b"\r\n"):
            if buf: yield buf
            buf = b""
        else: buf += line
c, r = req("POST", json.dumps({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"b","version":"1"}}}), {})
sid = r.getheader("mcp-session-id"); [e for e in events(r)]
c, r = req("POST", json.dumps({"jsonrpc":"2.0","method":"notifications/initialized"}), {"Mcp-Session-Id": sid}); r.read()
lat = []; tput = []
for i in range(reps):
    t0 = time.perf_counter()
    c, r = req("POST", json.dumps({"jsonrpc":"2.0","id":i+1,"method":"tools/call","params":{"name":"p","arguments":{"count":count,"interval_ms":0},"_meta":{"progressToken":i+1}}}), {"Mcp-Session-Id": sid})
    n = 0; first = None
    for e in events(r):
        if b'"progress"' in e:
            n += 1
            if first is None: first = time.perf_counter()
    t1 = time.perf_counter()
    lat.append((first - t0) * 1000); tput.append(n / (t1 - t0))
lat.sort(); tput.sort()
print(f"{lat[len(lat)//2]:.2f} {tput[len(tput)//2]:.0f}")
