"""A controller on another host: the same ``api.Controller`` spoken over the stdio of one remote command.

- values travel through ``skyserve_lite.codec``: the api's frozen dataclasses and enums to JSON and back;
- ``protocol``: one JSON line per request and per answer, versioned, with raw byte payloads where bytes move
  (blob uploads, streamed logs);
- ``server``: `sky-lite controller rpc`, one request against the host's ``LocalController``;
- ``transport``: how a request reaches that command (``CommandTransport`` runs it, through ``ssh`` or
  directly; ``InProcessTransport`` runs the server in this process for tests);
- ``client``: ``RemoteController``, the second implementation of ``api.Controller``;
- ``ssh``, ``config``, ``bootstrap``, ``wheel``: reaching a host, what is recorded of it, installing it.
"""
