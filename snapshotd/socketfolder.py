"""The rule for the socket's folder, for the daemon and its clients alike.

Every agent hook's child checks it before it connects, so this module imports
nothing but :mod:`os` and :mod:`stat` (:mod:`snapshotd.fsutil` brings
contextlib, functools and the user databases).
"""

from __future__ import annotations

import os
import stat


def check_socket_folder(folder: str, *, create: bool = False, private: bool = False) -> None:
    """The rule for the socket's folder, for the daemon and its clients alike.

    It must be a folder (not a symlink) of this user that no one else may
    write to, or another user could put a socket of theirs, or a log symlink,
    where snapshotd looks. With ``create`` a missing folder is made mode 0700;
    without it, a missing folder raises FileNotFoundError. An unsafe one raises
    PermissionError (NotADirectoryError for a file) with one sentence.
    With ``private`` (a daemon that cannot read its peers' credentials) no
    one else may even enter it: its 0700 is then what keeps other users out.
    """
    if create:
        try:
            os.makedirs(folder, mode=0o700)
        except FileExistsError:
            pass
        else:
            os.chmod(folder, 0o700)
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode):
        raise PermissionError(f"Refusing the socket folder {folder}: it is a symlink.")
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"The socket folder {folder} is not a folder.")
    own = os.geteuid()
    if info.st_uid != own:
        raise PermissionError(f"Refusing the socket folder {folder}: it belongs to uid {info.st_uid}, not {own}.")
    if info.st_mode & 0o022:
        raise PermissionError(
            f"Refusing the socket folder {folder}: other users may write to it "
            f"(mode {stat.S_IMODE(info.st_mode):04o})."
        )
    if private and info.st_mode & 0o077:
        raise PermissionError(
            f"Refusing the socket folder {folder}: without peer credentials (SO_PEERCRED) its mode is what keeps "
            f"other users out, and it is {stat.S_IMODE(info.st_mode):04o}; run: chmod 700 {folder}"
        )
