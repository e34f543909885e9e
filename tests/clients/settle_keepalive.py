"""Back-to-back requests on ONE keep-alive connection with Python's http.client.

Driven by tests/settle_clients.rs: `python3 settle_keepalive.py PORT COUNT PATH...`.
For each PATH, in order, sends COUNT GET requests on one connection, each sent as soon as
the previous response has been read to its end (what a real client does), and prints one
line of JSON per path:

  {"path": ..., "statuses": {"200": 998, "429": 2}, "first_refused": 14,
   "ratelimit": {"\\"fw\\";r=1;t=0": 1000}, "connections": 1}

`first_refused` is the index of the first 429 (null if none); `ratelimit` counts each
distinct RateLimit field value; `connections` counts the sockets http.client opened (1 when
the connection was kept alive throughout).
"""

import http.client
import json
import sys


def run(port, count, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    statuses = {}
    fields = {}
    first_refused = None
    connections = 0
    sock = None
    for i in range(count):
        conn.request("GET", path, headers={"x-user": "settle-client"})
        if conn.sock is not sock:
            sock = conn.sock
            connections += 1
        response = conn.getresponse()
        response.read()
        status = str(response.status)
        statuses[status] = statuses.get(status, 0) + 1
        if response.status == 429 and first_refused is None:
            first_refused = i
        field = response.getheader("RateLimit", "")
        fields[field] = fields.get(field, 0) + 1
    conn.close()
    return {
        "path": path,
        "statuses": statuses,
        "first_refused": first_refused,
        "ratelimit": fields,
        "connections": connections,
    }


def main():
    port = int(sys.argv[1])
    count = int(sys.argv[2])
    for path in sys.argv[3:]:
        print(json.dumps(run(port, count, path), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
