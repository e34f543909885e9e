#!/usr/bin/env python3
"""Opens COUNT keep-alive connections to HOST:PORT, sends one request on each (so every
connection has been through the proxy once) and then holds them idle until killed.

Prints "READY <open>" once all are open, so run.sh can read the proxy's peak RSS then.
Usage: idle_conns.py HOST PORT COUNT PATH
"""

import resource
import socket
import sys
import time


def main() -> None:
    host, port, count, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, count + 100)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    request = (
        f"GET {path} HTTP/1.1\r\nHost: bench\r\nX-User-Id: idle\r\n\r\n".encode()
    )
    conns = []
    failed = 0
    for _ in range(count):
        s = socket.create_connection((host, port), timeout=10)
        try:
            s.sendall(request)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("closed before the response head")
                head += chunk
            # The bench upstream answers with a tiny Content-Length body; read it all.
            header, _, body = head.partition(b"\r\n\r\n")
            length = 0
            for line in header.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            while len(body) < length:
                chunk = s.recv(65536)
                if not chunk:
                    break
                body += chunk
            conns.append(s)
        except (OSError, ConnectionError):
            failed += 1
            s.close()
    print(f"READY {len(conns)} failed={failed}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
