"""The ``snapshotd`` command line: click commands that print what the launcher's calls return."""
