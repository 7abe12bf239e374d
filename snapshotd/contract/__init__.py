"""The wire contract's shapes every layer reads: param validation and the checkpoint reference grammar.

Below the engine, capture and store, which parse their options with it, and
below the socket (:mod:`snapshotd.server`), which frames requests; it imports
nothing of the package but :mod:`snapshotd.errors`, so no layer reaches up
into the socket for it (tests/test_structure.py holds both).
"""
