"""The ``snapshotd`` command line and the launcher that finds or starts a daemon."""
