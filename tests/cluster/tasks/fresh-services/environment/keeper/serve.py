"""The keeper: answers which start of it this is (a token of its own) and what its /state holds."""

import http.server
import pathlib
import uuid

BOOT = uuid.uuid4().hex
STATE = pathlib.Path("/state")


class Keeper(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        held = " ".join(sorted(path.name for path in STATE.iterdir())) or "empty"
        self.send_response(200)
        self.end_headers()
        self.wfile.write(f"boot {BOOT}; /state: {held}\n".encode())


http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Keeper).serve_forever()
