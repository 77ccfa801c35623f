"""The reader: answers what it finds in /startup/evidence.txt (its view of the shared volume), 404 before."""

import http.server
import pathlib

EVIDENCE = pathlib.Path("/startup/evidence.txt")


class Reader(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        found = EVIDENCE.read_bytes() if EVIDENCE.is_file() else None
        self.send_response(200 if found else 404)
        self.end_headers()
        self.wfile.write(found or b"nothing in /startup\n")


http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Reader).serve_forever()
