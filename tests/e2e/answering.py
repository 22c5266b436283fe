"""The replica the e2e tests run: a Python HTTP server on 127.0.0.1:$PORT, as a task's ``run:`` section.

A plain module (no pytest) so that tests/e2e/failover_harness.py, which benchmarks/failover_bench.py imports,
can take it as well as the tests; tests/e2e/conftest.py passes it on.
"""

from __future__ import annotations


def answering_run(body: str, status: str = "200") -> str:
    """The ``run:`` section of a replica that answers every GET on 127.0.0.1:$PORT with ``status`` and
    ``body``, Python expressions of ``os``, ``hashlib`` and the request handler ``self`` (in double quotes
    only: the script is a single-quoted shell word), and logs no request. Holds no ``{`` or ``}`` but those
    of ``body`` and ``status``, so that it can end a ``str.format`` template."""
    return f"""run: |
  exec python3 -u -c '
  import hashlib, http.server, os
  class Handler(http.server.BaseHTTPRequestHandler):
      def do_GET(self):
          body = ({body}).encode()
          self.send_response({status})
          self.send_header("Content-Length", str(len(body)))
          self.end_headers()
          self.wfile.write(body)
      def log_message(self, *args):
          pass
  http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
  '
"""
