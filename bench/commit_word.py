#!/usr/bin/env python3
"""What each way of surviving a stale commit word costs (log backend, docs/log-queue.md).

    .venv/bin/python bench/commit_word.py [--dir DIR] [--segment-mib 64] [--fsyncs 200]

The log's commit word is never fsync'd; after a power cut the first writer of a new
boot recovers the head segment's true end from the records' checksums instead
(logcommit.LogWriter._this_boot). The alternative is an fsync of the word at every
group commit. This prints both costs on the file system holding DIR: the recovery
scan of a full head segment of ENVELOPE records (once per boot; page cache warm and
after dropping it when run as root) and one fsync of the 56-byte word (per commit).
"""
import argparse
import os
import shutil
import statistics
import tempfile
import time

from qmailpy.backends.log.records import HEADER_SIZE, encode_envelope, segment_header, valid_end


def scan(path):
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)
    end = valid_end(data)
    return time.perf_counter() - start, end


def drop_caches():
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    ap.add_argument("--segment-mib", type=int, default=64, help="head segment size (default 64, the segment limit)")
    ap.add_argument("--fsyncs", type=int, default=200)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="qmailpy-commit-word-", dir=args.dir)
    try:
        record = encode_envelope(1764000000, 1234567, 0, 4242, b"joe@test.example",
                                 [b"a@test.example", b"b@test.example"])
        count = (args.segment_mib * 1024 * 1024 - HEADER_SIZE) // len(record)
        data = segment_header(1) + record * count
        path = os.path.join(work, "segment")
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        warm = []
        for _ in range(5):
            took, end = scan(path)
            assert end == len(data), (end, len(data))
            warm.append(took)
        print("recovery scan, once per boot: %d records, %d bytes: warm cache median %.1f ms"
              % (count, len(data), statistics.median(warm) * 1000))
        if drop_caches():
            took, _ = scan(path)
            print("recovery scan after dropping the page cache: %.1f ms" % (took * 1000))
        word = os.path.join(work, "commit")
        fd = os.open(word, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            times = []
            for i in range(args.fsyncs):
                os.pwrite(fd, i.to_bytes(8, "little") * 7, 0)
                start = time.perf_counter()
                os.fsync(fd)
                times.append(time.perf_counter() - start)
        finally:
            os.close(fd)
        times.sort()
        fsync = statistics.median(times)
        print("fsync of the commit word, once per group commit: median %.0f us, p90 %.0f us (%d runs)"
              % (fsync * 1e6, times[int(len(times) * 0.9)] * 1e6, len(times)))
        print("break-even: the scan costs as much as %.0f group commits' fsyncs"
              % (statistics.median(warm) / fsync))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
