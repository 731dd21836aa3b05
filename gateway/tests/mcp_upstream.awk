# A minimal stdio MCP server for the gateway's MCP end-to-end tests (gateway/tests/mcp_e2e.rs),
# so those tests need nothing beyond POSIX awk and sleep. It understands only what the tests
# send, as the gateway forwards it (compact JSON, keys sorted; integer ids, or the gateway's
# string ids such as "gw-0" for 2026-07-28 requests):
#   initialize                           -> InitializeResult (protocol 2025-11-25)
#   tools/call {count, interval_ms}      -> `count` notifications/progress (progress 1..count,
#                                           for the request's integer progressToken), `interval_ms`
#                                           apart, then a result {"sent": count}
#   tools/call with name "die"           -> exits with status 3 (upstream death)
#   any other request                    -> empty result; notifications are ignored.
# With -v trace=<file>, every received line is appended to <file> (tests check what arrived).
{
  if (trace != "") { print $0 >> trace; fflush(trace) }
  id = ""; method = ""; n = 0; tok = ""; ms = 0
  if (match($0, /"id":("[^"]*"|[0-9]+)/)) id = substr($0, RSTART + 5, RLENGTH - 5)
  if (match($0, /"method":"[^"]*"/)) method = substr($0, RSTART + 10, RLENGTH - 11)
  if (id == "" || method == "") next
  if (method == "initialize") {
    print "{\"jsonrpc\":\"2.0\",\"id\":" id ",\"result\":{\"protocolVersion\":\"2025-11-25\",\"capabilities\":{\"tools\":{}},\"serverInfo\":{\"name\":\"awk-upstream\",\"version\":\"1\"}}}"
    fflush()
    next
  }
  if (method == "tools/call") {
    if ($0 ~ /"name":"die"/) exit 3
    if (match($0, /"count":[0-9]+/)) n = substr($0, RSTART + 8, RLENGTH - 8) + 0
    if (match($0, /"interval_ms":[0-9]+/)) ms = substr($0, RSTART + 14, RLENGTH - 14) + 0
    if (match($0, /"progressToken":("[^"]*"|[0-9]+)/)) tok = substr($0, RSTART + 16, RLENGTH - 16)
    for (i = 1; i <= n; i++) {
      if (tok != "") {
        print "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":" tok ",\"progress\":" i ",\"total\":" n "}}"
        fflush()
      }
      if (ms > 0 && i < n) system("sleep " ms / 1000)
    }
    print "{\"jsonrpc\":\"2.0\",\"id\":" id ",\"result\":{\"content\":[],\"structuredContent\":{\"sent\":" n "}}}"
    fflush()
    next
  }
  print "{\"jsonrpc\":\"2.0\",\"id\":" id ",\"result\":{}}"
  fflush()
}
