"""A real OTLP trace receiver for tests/traces.rs: gRPC (grpcio) and HTTP/protobuf (http.server)
on two ports, each span written as one JSON line to stdout.

    otlp_receiver.py [--delay SECONDS]

With --delay, each export is answered that long after it arrived (its spans are printed
first): a slow collector. Prints `ready GRPC_PORT HTTP_PORT` first (ports the system chose), then one line per span:
{"via", "trace_id", "span_id", "parent_span_id", "name", "kind", "status", "start", "end",
"attributes", "events", "resource"} (ids in lower-case hex, kind and status as the protocol's
numbers, start and end in nanoseconds since the Unix epoch).
Needs grpcio, protobuf and opentelemetry-proto (.ci/run installs them into
tests/clients/.venv-otlp).
"""

import argparse
import json
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

lock = threading.Lock()
delay = 0.0


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def dump(request, via):
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                line = json.dumps(
                    {
                        "via": via,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "name": span.name,
                        "kind": span.kind,
                        "status": span.status.code,
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                        "attributes": attributes(span.attributes),
                        "events": [
                            {"name": e.name, "attributes": attributes(e.attributes)}
                            for e in span.events
                        ],
                        "resource": resource,
                    }
                )
                with lock:
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        dump(request, "grpc")
        time.sleep(delay)
        return trace_service_pb2.ExportTraceServiceResponse()


class HttpReceiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        dump(request, "http")
        time.sleep(delay)
        reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def main():
    global delay
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay", type=float, default=0.0)
    delay = parser.parse_args().delay
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    http = ThreadingHTTPServer(("127.0.0.1", 0), HttpReceiver)
    with lock:
        sys.stdout.write(f"ready {grpc_port} {http.server_address[1]}\n")
        sys.stdout.flush()
    http.serve_forever()


if __name__ == "__main__":
    main()
