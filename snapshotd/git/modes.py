"""git's file modes, as trees and indexes store them, and the rules read from them."""

MODE_FILE = 0o100644
MODE_EXEC = 0o100755
MODE_LINK = 0o120000
MODE_GITLINK = 0o160000
MODE_TREE = 0o040000

_KIND_MASK = 0o170000
_REGULAR = 0o100000


def is_file_mode(mode: int) -> bool:
    """True for a regular file's mode, executable or not."""
    return mode & _KIND_MASK == _REGULAR
