#!/usr/bin/env python3
"""fsync-shapes.py [DIR]: what one durable commit round costs on DIR's filesystem, by shape.

A commit round of the gateway's log makes every shard with new records durable: one
`fdatasync` per shard file, all in flight at once (io_uring runs them on its workers). This
measures, for k = 1, 2, 4, 8 files (the default layout has 8 shards), each with a 300-byte
write into a fresh page of a preallocated 16 MiB file written through a shared mapping (as the
log writes its segments):

  - k `fdatasync`s in parallel (one thread each), the round the gateway runs today;
  - one `syncfs` covering the whole filesystem instead (every dirty file of it, other
    processes' included);
  - k `fdatasync`s in parallel on files zero-filled (written and synced) beforehand, so each
    write overwrites a written block and no sync has an extent to convert.

Prints the median and p99 of ROUNDS rounds per shape (microseconds). Files are made under
DIR (default: a temporary directory in the working directory, so the filesystem of a data
directory under it) and removed at the end. Environment: ROUNDS (default 300).
"""
import ctypes
import mmap
import os
import statistics
import sys
import tempfile
import threading
import time

FILE_BYTES = 16 << 20
WRITE = b"x" * 300
libc = ctypes.CDLL(None, use_errno=True)


def files(d, k, tag, zeroed=False):
    out = []
    for i in range(k):
        name = os.path.join(d, f"{tag}{k}-{i}")
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.posix_fallocate(fd, 0, FILE_BYTES)
        if zeroed:
            # Written once and made durable: later writes overwrite written blocks, so an
            # fdatasync has no extent to convert (no journal commit), as for a WAL segment
            # PostgreSQL zero-fills before use (wal_init_zero).
            zeros = bytes(1 << 20)
            for off in range(0, FILE_BYTES, len(zeros)):
                os.pwrite(fd, zeros, off)
            os.fdatasync(fd)
        out.append((fd, mmap.mmap(fd, FILE_BYTES)))
    return out


def parallel_fdatasync(fs):
    threads = [threading.Thread(target=os.fdatasync, args=(fd,)) for fd, _ in fs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def one_syncfs(fs):
    if libc.syncfs(fs[0][0]) != 0:
        raise OSError(ctypes.get_errno(), "syncfs")


def zeroed_fdatasync(fs):
    parallel_fdatasync(fs)


def measure(d, k, how, rounds):
    fs = files(d, k, how.__name__, zeroed=how is zeroed_fdatasync)
    times = []
    try:
        for r in range(rounds):
            off = (r * 4096) % FILE_BYTES
            for _, m in fs:
                m[off : off + len(WRITE)] = WRITE
            start = time.perf_counter()
            how(fs)
            times.append((time.perf_counter() - start) * 1e6)
    finally:
        for fd, m in fs:
            m.close()
            os.close(fd)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))]


def main():
    rounds = int(os.environ.get("ROUNDS", "300"))
    base = sys.argv[1] if len(sys.argv) > 1 else "."
    with tempfile.TemporaryDirectory(dir=base, prefix="fsync-shapes.") as d:
        print(f"fsync-shapes: {rounds} rounds per shape in {os.path.realpath(d)}")
        print(
            "files | k fdatasync in parallel: p50 / p99 us | one syncfs: p50 / p99 us"
            " | k fdatasync, files zero-filled first: p50 / p99 us"
        )
        for k in (1, 2, 4, 8):
            p = measure(d, k, parallel_fdatasync, rounds)
            s = measure(d, k, one_syncfs, rounds)
            z = measure(d, k, zeroed_fdatasync, rounds)
            print(
                f"{k:5} | {p[0]:10.0f} / {p[1]:6.0f} | {s[0]:10.0f} / {s[1]:6.0f}"
                f" | {z[0]:10.0f} / {z[1]:6.0f}"
            )


if __name__ == "__main__":
    main()
