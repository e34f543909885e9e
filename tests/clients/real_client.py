"""Real Python clients for tests/real_clients.rs: the standard library's http.client and the
requests library, driven the way applications drive them. Prints one JSON object on stdout.

    real_client.py http-client-upload URL SIZE TRIES [CAFILE]
    real_client.py http-client-keepalive URL COUNT
    real_client.py requests-upload URL SIZE TRIES
    real_client.py requests-keepalive URL COUNT

An upload sends SIZE bytes with Content-Length on a new connection per try; http.client writes
the whole body before it reads the answer, which is what makes an early answer hard to
receive. Each try reports {"status": N, "body": TEXT} or {"error": "ExceptionName: text"}.
Keep-alive sends COUNT GETs back to back on one connection (a requests Session) and reports
each status with its Retry-After, and how many connections were opened.
"""

import http.client
import json
import ssl
import sys
import urllib.parse

TIMEOUT = 60


def connection(url, cafile=None):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=cafile)
        return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=TIMEOUT, context=context)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT)


def path_of(url):
    parts = urllib.parse.urlsplit(url)
    return (parts.path or "/") + ("?" + parts.query if parts.query else "")


def failure(error):
    return {"error": "%s: %s" % (type(error).__name__, error)}


def http_client_upload(url, size, tries, cafile=None):
    body = b"x" * size
    results = []
    for _ in range(tries):
        conn = connection(url, cafile)
        try:
            conn.request("POST", path_of(url), body=body,
                         headers={"Content-Type": "application/octet-stream"})
            response = conn.getresponse()
            text = response.read().decode("utf-8", "replace")
            results.append({"status": response.status, "body": text})
        except Exception as error:  # the point: which error a client sees instead of its answer
            results.append(failure(error))
        finally:
            conn.close()
    return {"results": results}


def http_client_keepalive(url, count):
    conn = connection(url)
    results = []
    sockets = set()
    for _ in range(count):
        try:
            conn.request("GET", path_of(url))
            sockets.add(conn.sock.getsockname())
            response = conn.getresponse()
            response.read()
            results.append({"status": response.status,
                            "retry_after": response.getheader("Retry-After")})
        except Exception as error:
            results.append(failure(error))
    conn.close()
    return {"results": results, "connections": len(sockets)}


def requests_upload(url, size, tries):
    import requests
    body = b"x" * size
    results = []
    for _ in range(tries):
        try:
            response = requests.post(url, data=body, timeout=TIMEOUT,
                                     headers={"Content-Type": "application/octet-stream"})
            results.append({"status": response.status_code, "body": response.text})
        except Exception as error:
            results.append(failure(error))
    return {"results": results}


def requests_keepalive(url, count):
    import requests
    opened = []
    session = requests.Session()
    adapter = session.get_adapter(url)
    results = []
    for _ in range(count):
        try:
            response = session.get(url, timeout=TIMEOUT)
            results.append({"status": response.status_code,
                            "retry_after": response.headers.get("Retry-After")})
        except Exception as error:
            results.append(failure(error))
    pool = adapter.poolmanager.connection_from_url(url)
    opened.append(pool.num_connections)
    session.close()
    return {"results": results, "connections": sum(opened)}


def main(argv):
    command, url = argv[1], argv[2]
    if command == "http-client-upload":
        cafile = argv[5] if len(argv) > 5 else None
        out = http_client_upload(url, int(argv[3]), int(argv[4]), cafile)
    elif command == "http-client-keepalive":
        out = http_client_keepalive(url, int(argv[3]))
    elif command == "requests-upload":
        out = requests_upload(url, int(argv[3]), int(argv[4]))
    elif command == "requests-keepalive":
        out = requests_keepalive(url, int(argv[3]))
    else:
        raise SystemExit("unknown command %r" % command)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv)
