"""The reader: answers what it sees in /seen (the volume it shares with the seeder), owners and modes."""

import http.server
import os
import pathlib

SEEN = pathlib.Path("/seen")


def line(path: pathlib.Path, name: str) -> str:
    status = path.lstat()
    return f"{name} {status.st_uid}:{status.st_gid} {status.st_mode & 0o7777:o}"


class Reader(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        lines = [line(SEEN, str(SEEN))] + [line(SEEN / name, name) for name in sorted(os.listdir(SEEN))]
        self.send_response(200)
        self.end_headers()
        self.wfile.write(("\n".join(lines) + "\n").encode())


http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Reader).serve_forever()
