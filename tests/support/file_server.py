"""Files served for real over HTTP (http.server in a thread): a release-wheel mirror at `/files/<name>`.

    with FileServer() as server:
        server.files["x.whl"] = "/path/to/x.whl"   # served name -> local path
        server.httpd.server_address[1]             # the port
        server.requests                            # every path asked for, in order
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


class FileServer:
    def __init__(self, port: int = 0):
        """port: 0 for any free one; a given one serves again where a stopped server was (a source back up)."""
        self.files: dict = {}
        self.requests: list = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):   # quiet
                pass

            def do_GET(self):
                owner.requests.append(unquote(self.path))
                parts = [p for p in unquote(self.path).split("?")[0].split("/") if p]
                if len(parts) == 2 and parts[0] == "files" and parts[1] in owner.files:
                    with open(owner.files[parts[1]], "rb") as fh:
                        self._send(200, "application/octet-stream", fh.read())
                else:
                    self._send(404, "text/plain", b"not found")

            def _send(self, code, kind, body):
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
