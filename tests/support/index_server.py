"""A local package index of prebuilt kernel wheels, served for real over HTTP (http.server in a
thread), in the layout of Astral's indexes (FACTS: `/simple/<channel>/<project>/`, PEP 691 JSON
api 1.x with `hashes.sha256` per file; the PEP 503 HTML page for a client that asks for HTML).

    with IndexServer() as index:
        index.add("cu130", "causal-conv1d", "/path/to/causal_conv1d-1.6.2.post1+cu.13.0.torch.2.13-...whl")
        index.add("cu130", "causal-conv1d", path, sha256="0" * 64)      # a listed hash the bytes do not have
        index.base      # http://127.0.0.1:PORT/simple/
        index.requests  # every path asked for, in order
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote


class IndexServer:
    def __init__(self, port: int = 0):
        """port: 0 for any free one; a given one serves again where a stopped server was (a source back up)."""
        self.pages: dict = {}      # (channel, project) -> [file entries]
        self.files: dict = {}      # served name -> local path
        self.requests: list = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):   # quiet
                pass

            def do_GET(self):
                owner.requests.append(unquote(self.path))
                parts = [p for p in unquote(self.path).split("?")[0].split("/") if p]
                if len(parts) == 3 and parts[0] == "simple" and (parts[1], parts[2]) in owner.pages:
                    self._page(parts[1], parts[2])
                elif len(parts) == 2 and parts[0] == "files" and parts[1] in owner.files:
                    with open(owner.files[parts[1]], "rb") as fh:
                        body = fh.read()
                    self._send(200, "application/octet-stream", body)
                else:
                    self._send(404, "text/plain", b"not found")

            def _page(self, channel, project):
                entries = owner.pages[(channel, project)]
                if "json" in (self.headers.get("Accept") or ""):
                    body = json.dumps({"meta": {"api-version": "1.4"}, "name": project, "files": entries}).encode()
                    self._send(200, "application/vnd.pypi.simple.v1+json", body)
                    return
                links = "".join(f'<a href="{e["url"]}#sha256={e["hashes"].get("sha256", "")}">{e["filename"]}</a><br>'
                                for e in entries)
                self._send(200, "text/html", f"<html><body>{links}</body></html>".encode())

            def _send(self, code, kind, body):
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/simple/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def add(self, channel: str, project: str, path: str, *, sha256: str | None = "auto", relative: bool = True) -> dict:
        """List `path` on the project page (its real sha256 unless `sha256` says otherwise; None: no hash)."""
        name = os.path.basename(path)
        self.files[name] = path
        if sha256 == "auto":
            with open(path, "rb") as fh:
                sha256 = hashlib.sha256(fh.read()).hexdigest()
        url = f"../../../files/{quote(name)}" if relative else self.base.replace("/simple/", "/files/") + quote(name)
        entry = {"filename": name, "url": url, "hashes": {"sha256": sha256} if sha256 else {},
                 "requires-python": ">=3.9", "size": os.path.getsize(path)}
        self.pages.setdefault((channel, project), []).append(entry)
        return entry

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
