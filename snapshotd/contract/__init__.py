"""The wire contract every end reads: framing, peer checks, param validation and the checkpoint reference grammar.

Below the socket's server (:mod:`snapshotd.server`) and its clients
(:mod:`snapshotd.client`), which frame requests with it, and below the engine,
capture and store, which parse their options with it; it imports nothing of
the package but :mod:`snapshotd.errors`, so no layer reaches up into the
socket for it (tests/test_structure.py holds both).
"""
