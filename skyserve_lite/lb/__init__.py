"""Load balancer: one HTTP/1.1 proxy process per service in front of its READY replicas.

The path of a request, one module each: ``listener`` accepts the client's connection, ``server`` parses
its requests and writes the answers, ``proxy`` decides (replica, holding, retries, counting, load reports)
with a policy from ``policies``, and ``pooled_upstream`` carries the request to the replica under the
contract in ``upstream``. Both ends frame HTTP/1.1 with ``http1`` (llhttp, through httptools: what is
refused and why), and run on uvloop where it is installed. ``settings`` reads the ``SKY_LITE_LB_*``
variables; ``__main__`` is the process.
"""
