#!/usr/bin/env python3
"""Exactly-once tests of the gateway's MCP front with the official Python client (`mcp` from
PyPI, streamable HTTP transport), over real loopback sockets.

A cutting TCP proxy between client and gateway kills connections at random byte offsets (after
a response's first event, mid-event included). The client calls mcp-fixture's
`progress_stream` (progress 1..count); each test asserts the client saw exactly 1..count, in
order, plus the result:
  auto     the client resumes by itself (GET + Last-Event-ID) after every cut;
  token    the client is dropped, a new client resumes with an explicit resumption token
           (`ClientMessageMetadata(resumption_token=...)`);
  restart  the gateway is restarted (SIGTERM, same data dir) between the cut and the resume.
Seeds are printed (SEED=<n> replays one). Every wait is bounded. Exit 0 = all passed.
Usage: GATEWAY_BIN=target/debug/gateway .tools/venv/bin/python mcp-tests/exactly_once.py [test ...]
"""

import asyncio
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import httpx
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import ClientMessageMetadata

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GATEWAY_BIN = os.environ.get("GATEWAY_BIN", str(ROOT / "target/debug/gateway"))
NODE = shutil.which("node") or "node"
FIXTURE = f"'{NODE}' '{ROOT / 'mcp-fixture/server.mjs'}'"
TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    def __init__(self) -> None:
        self.data_dir = tempfile.mkdtemp(prefix="mcp-eo-py-")
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            GATEWAY_BIN, "--listen", f"127.0.0.1:{self.port}", "--admin-listen", "127.0.0.1:0", "--data-dir", self.data_dir,
            "--cores", "2", "--upstream-cmd", FIXTURE, "--mcp-retry-ms", "50",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        line = await asyncio.wait_for(self.proc.stdout.readline(), 20)
        assert b"listening on" in line, f"gateway did not start: {line!r}"
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    async def stop(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    def cleanup(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)


class CutProxy:
    """Forwards TCP; cuts server→client data at drawn offsets; can hold client→server data."""

    def __init__(self, target_port: int, rng: random.Random) -> None:
        self.target_port = target_port
        self.rng = rng
        self.cuts_left = 0
        self.cuts = 0
        self.min_bytes, self.max_bytes = 250, 3000
        self.holding = asyncio.Event()
        self.holding.set()  # set = flowing
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.on_client, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    async def on_client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        # The upstream connection is opened on the first client bytes and reopened after it
        # died while holding (the gateway restarted): held requests then reach the new gateway
        # instead of failing — like a load balancer draining a restart.
        self.writers.add(cw)
        done = asyncio.Event()
        tasks: list[asyncio.Task] = []
        uw: asyncio.StreamWriter | None = None

        async def down(ur: asyncio.StreamReader, uw_: asyncio.StreamWriter) -> None:
            sent, cut_at = 0, None
            try:
                while data := await ur.read(65536):
                    if cut_at is None and self.cuts_left > 0:
                        cut_at = sent + self.rng.randint(self.min_bytes, self.max_bytes)
                    if cut_at is not None and sent + len(data) >= cut_at and self.cuts_left > 0:
                        cw.write(data[: cut_at - sent])
                        await cw.drain()
                        self.cuts_left -= 1
                        self.cuts += 1
                        done.set()
                        return
                    sent += len(data)
                    cw.write(data)
                    await cw.drain()
            except (OSError, ConnectionError):
                pass
            uw_.transport.abort()
            self.writers.discard(uw_)
            if self.holding.is_set():
                done.set()  # the gateway closed it normally: so do we

        async def up() -> None:
            nonlocal uw
            try:
                while data := await cr.read(65536):
                    await self.holding.wait()
                    if uw is None or uw.is_closing():
                        ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
                        self.writers.add(uw)
                        tasks.append(asyncio.create_task(down(ur, uw)))
                    uw.write(data)
                    await uw.drain()
            except (OSError, ConnectionError):
                pass
            done.set()

        tasks.append(asyncio.create_task(up()))
        await done.wait()
        for w in (cw, uw):
            if w is not None:
                w.transport.abort()
                self.writers.discard(w)
        for t in tasks:
            t.cancel()

    async def close(self) -> None:
        for w in list(self.writers):
            w.transport.abort()
        self.server.close()


def expect_exactly(seen: list[int], count: int, what: str) -> None:
    want = list(range(1, count + 1))
    if seen != want:
        dups = sorted({v for v in seen if seen.count(v) > 1})[:10]
        missing = sorted(set(want) - set(seen))[:10]
        raise AssertionError(f"{what}: {len(seen)} progress values, duplicates {dups}, missing {missing}")


def tool_call(count: int, interval_ms: int) -> types.ClientRequest:
    return types.ClientRequest(types.CallToolRequest(
        params=types.CallToolRequestParams(name="progress_stream", arguments={"count": count, "interval_ms": interval_ms})))


async def test_auto(seed: int) -> str:
    rng = random.Random(seed)
    gw = Gateway()
    await gw.start()
    proxy = CutProxy(gw.port, rng)
    await proxy.start()
    try:
        async with streamable_http_client(proxy.url) as (r, w, _), ClientSession(r, w) as s:
            await s.initialize()
            count = rng.randint(120, 220)
            proxy.cuts_left = rng.randint(3, 6)
            seen: list[int] = []

            async def on_progress(p: float, total: float | None, msg: str | None) -> None:
                seen.append(int(p))

            res = await asyncio.wait_for(s.call_tool("progress_stream", {"count": count, "interval_ms": 3},
                                                     progress_callback=on_progress), TIMEOUT_S)
            assert res.structuredContent == {"sent": count}, res
            expect_exactly(seen, count, f"auto seed={seed}")
            assert proxy.cuts >= 1, "the proxy cut nothing: resumption was not tested"
            return f"count={count} cuts={proxy.cuts}"
    finally:
        await proxy.close()
        await gw.stop()
        gw.cleanup()


async def test_token(seed: int) -> str:
    rng = random.Random(seed)
    gw = Gateway()
    await gw.start()
    try:
        count = rng.randint(100, 160)
        cut_after = rng.randint(1, count // 2)
        seen: list[int] = []
        tokens: list[str] = []  # tokens[0]: priming event, tokens[k]: progress k
        reached = asyncio.Event()

        async def on_token(t: str) -> None:
            tokens.append(t)

        async def on_progress(p: float, total: float | None, msg: str | None) -> None:
            seen.append(int(p))
            if len(seen) >= cut_after:
                reached.set()

        async with streamable_http_client(gw.url, terminate_on_close=False) as (r, w, get_sid):
            async with ClientSession(r, w) as s:
                await s.initialize()
                sid = get_sid()
                call = asyncio.create_task(s.send_request(
                    tool_call(count, 5), types.CallToolResult,
                    metadata=ClientMessageMetadata(on_resumption_token_update=on_token),
                    progress_callback=on_progress))
                await asyncio.wait_for(reached.wait(), TIMEOUT_S)
                call.cancel()  # drop the client: a disconnect, not an MCP cancellation
        # The application counts a progress as processed only with its token (the client
        # reports the token after handing the message over).
        processed = min(len(seen), len(tokens) - 1)
        del seen[processed:]
        token = tokens[processed]
        got: list[int] = []
        done = asyncio.Event()

        async def on_message(m) -> None:
            if isinstance(m, types.ServerNotification) and isinstance(m.root, types.ProgressNotification):
                got.append(int(m.root.params.progress))

        async with httpx.AsyncClient(headers={"mcp-session-id": sid}, timeout=httpx.Timeout(30, read=TIMEOUT_S)) as hc:
            async with streamable_http_client(gw.url, http_client=hc, terminate_on_close=False) as (r, w, _):
                async with ClientSession(r, w, message_handler=on_message) as s2:
                    res = await asyncio.wait_for(s2.send_request(
                        tool_call(count, 5), types.CallToolResult,
                        metadata=ClientMessageMetadata(resumption_token=token)), TIMEOUT_S)
                    done.set()
        assert res.structuredContent == {"sent": count}, res
        expect_exactly(seen + got, count, f"token seed={seed} processed={processed}")
        return f"count={count} resumed after {processed}"
    finally:
        await gw.stop()
        gw.cleanup()


async def test_restart(seed: int) -> str:
    rng = random.Random(seed)
    gw = Gateway()
    await gw.start()
    proxy = CutProxy(gw.port, rng)
    await proxy.start()
    try:
        async with streamable_http_client(proxy.url, terminate_on_close=False) as (r, w, get_sid), ClientSession(r, w) as s:
            await s.initialize()
            count = rng.randint(60, 120)
            seen: list[int] = []
            tokens: list[str] = []

            async def on_token(t: str) -> None:
                tokens.append(t)

            async def on_progress(p: float, total: float | None, msg: str | None) -> None:
                seen.append(int(p))

            proxy.cuts_left = 1
            proxy.min_bytes, proxy.max_bytes = 400, 2500
            call = asyncio.create_task(s.send_request(
                tool_call(count, 2), types.CallToolResult, request_read_timeout_seconds=timedelta(seconds=TIMEOUT_S),
                metadata=ClientMessageMetadata(on_resumption_token_update=on_token), progress_callback=on_progress))
            deadline = time.monotonic() + TIMEOUT_S
            while proxy.cuts == 0:
                assert time.monotonic() < deadline, "the proxy never cut"
                await asyncio.sleep(0.001)
            proxy.holding.clear()  # hold every request until the gateway is back
            for _ in range(500):
                if tokens:
                    break
                await asyncio.sleep(0.01)
            assert tokens, "the client saw the priming event before the cut"
            # Wait until the stream is complete in the log (side channel straight to the gateway).
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as hc:
                resp = await hc.get(gw.url, headers={"accept": "text/event-stream", "mcp-session-id": get_sid(),
                                                     "last-event-id": tokens[0]})
                assert resp.status_code == 200 and '"result"' in resp.text, resp.text[-300:]
            seen_at_cut = len(seen)
            await gw.stop()
            await gw.start()  # same port, same data dir
            proxy.holding.set()
            res = await asyncio.wait_for(call, TIMEOUT_S)
            assert res.structuredContent == {"sent": count}, res
            expect_exactly(seen, count, f"restart seed={seed}")
            return f"count={count} seen at cut={seen_at_cut}"
    finally:
        await proxy.close()
        await gw.stop()
        gw.cleanup()


TESTS = {"auto": (test_auto, 3), "token": (test_token, 3), "restart": (test_restart, 2)}


def describe(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(describe(x) for x in e.exceptions)
    return f"{type(e).__name__}: {e}"


async def main(names: list[str]) -> int:
    failed = 0
    for name in names or list(TESTS):
        fn, rounds = TESTS[name]
        for r in range(1 if "SEED" in os.environ else rounds):
            seed = int(os.environ.get("SEED", (time.time_ns() // 1000 + r * 7919) % 2**32))
            t0 = time.monotonic()
            try:
                info = await asyncio.wait_for(fn(seed), 2 * TIMEOUT_S)
                print(f"ok   py {name} seed={seed} {info} ({(time.monotonic() - t0) * 1000:.0f} ms)", flush=True)
            except BaseException as e:  # noqa: BLE001 — report every failure, keep going
                failed += 1
                print(f"FAIL py {name} seed={seed}: {describe(e)}", flush=True)
    print(f"{failed} failed" if failed else "all passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
