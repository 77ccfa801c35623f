import http.server


class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        with open("/srv/answer", "rb") as answer:
            body = answer.read()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)


http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Answer).serve_forever()
