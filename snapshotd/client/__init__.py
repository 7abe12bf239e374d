"""The daemon's clients: the Python client, an agent hook's one call, the launcher that finds or starts a daemon.

Above the wire contract (:mod:`snapshotd.contract`), beside the socket's server
(:mod:`snapshotd.server`), which it never imports; the command line, the
agent integrations and the ui reach the daemon only through here
(tests/test_structure.py holds the layering).
"""
