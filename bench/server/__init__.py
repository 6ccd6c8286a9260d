"""A real `seq2serve serve` process under load, each benchmark a command:

- `python -m seq2serve.bench.server.load`: batching off, request-level and
  iteration-level side by side, closed-loop levels and Poisson arrivals;
- `python -m seq2serve.bench.server.soak`: every answer of many distinct texts at
  high concurrency checked against the same text translated alone;
- `python -m seq2serve.bench.server.http`: the HTTP door beside LibreTranslate on
  the same model (`libretranslate_peer` builds and starts that peer,
  `python -m seq2serve.bench.server.libretranslate_peer`).

`clients` is their one closed loop (and the open loop), told how to send one
request; `serving` starts the server on loopback and holds `free_port`.
"""
