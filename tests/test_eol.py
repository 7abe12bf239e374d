"""The in-process end-of-line conversion against git's own, byte for byte (capture/eol.py).

``git hash-object --path=NAME FILE...`` converts each file under the attributes
of NAME with no index (so ``has_crlf_in_index`` is false there): the same
``crlf_to_git`` the capture reproduces. Contents are drawn to sit on the edges
of git's "looks binary" test (a lone CR, a NUL, a trailing Ctrl-Z, one control
character in 127 or 128 printable ones). The index's part is checked against
``git add`` itself.
"""

from __future__ import annotations

from pathlib import Path

import pygit2
from hypothesis import given, settings, strategies as st
from repo_helpers import git, git_run

from snapshotd.capture.eol import AUTO, BINARY, TEXT, action, has_crlf, to_git

PIECES = [b"\r", b"\n", b"\r\n", b"\0", b"\x1a", b"\x7f", b"\x01", b"\t", b"\x1b", b"\x0c", b"\x08", b"\xff", b"a",
          b"a" * 126, b"b" * 127, b"c" * 128, b"d" * 255, b"e" * 256]
contents = st.lists(st.sampled_from(PIECES), max_size=12).map(b"".join)

RULES = {"auto.txt": "text=auto", "text.txt": "text", "input.txt": "text=input", "eol.txt": "eol=crlf",
         "binary.txt": "-text", "crlf.txt": "crlf", "nocrlf.txt": "-crlf", "autoeol.txt": "text=auto eol=lf"}
EXPECTED = {"auto.txt": AUTO, "text.txt": TEXT, "input.txt": TEXT, "eol.txt": TEXT, "binary.txt": BINARY,
            "crlf.txt": TEXT, "nocrlf.txt": BINARY, "autoeol.txt": AUTO}


def repo_with_rules(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if not (root / ".git").exists():
        git(root, "init", "-q")
        (root / ".gitattributes").write_text("".join(f"{name} {rule}\n" for name, rule in RULES.items()))
    return root


def test_check_attr_values_give_git_s_actions(tmp_path: Path) -> None:
    repo = repo_with_rules(tmp_path / "r")
    for name, expected in EXPECTED.items():
        lines = git(repo, "check-attr", "text", "crlf", "eol", "--", name).splitlines()
        values = {line.split(": ")[1]: line.split(": ")[2] for line in lines}
        assert action(values["text"], values["crlf"], values["eol"]) == expected, name
    assert action("unspecified", "unspecified", "unspecified") is None  # core.autocrlf decides


EDGES = [
    b"a\r\n\x1a",  # a trailing Ctrl-Z is not counted as a control character
    b"a\r\n\x1a\x1a",  # only the last one
    b"a" * 127 + b"\x01\r\n",  # one control character in 127 printable ones: binary
    b"a" * 128 + b"\x01\r\n",  # in 128: text
    b"a" * 255 + b"\x7f\x01\r\n",
    b"a" * 256 + b"\x7f\x01\r\n",
    b"\r\r\n",  # a lone CR: binary
    b"\x08\t\x1b\x0c\r\n",  # BS, HT, ESC and FF count as printable
    b"\xff\xfe\r\n",
]


def test_conversion_equals_git_s_on_the_edges(tmp_path: Path) -> None:
    compare_with_git(repo_with_rules(tmp_path / "r"), EDGES)


@settings(max_examples=60, deadline=None)
@given(batch=st.lists(contents, min_size=1, max_size=20))
def test_conversion_equals_git_s(tmp_path_factory, batch: list[bytes]) -> None:
    compare_with_git(repo_with_rules(tmp_path_factory.getbasetemp() / "eol-repo"), batch)


def compare_with_git(repo: Path, batch: list[bytes]) -> None:
    files = []
    for index, data in enumerate(batch):
        path = repo / f"in{index}"
        path.write_bytes(data)
        files.append(str(path))
    for name, chosen in EXPECTED.items():
        ids = git(repo, "hash-object", f"--path={name}", *files).splitlines()
        for data, oid in zip(batch, ids, strict=True):
            ours = to_git(data, chosen, lambda: None)
            assert str(pygit2.hash(ours)) == oid, (name, data)


@settings(max_examples=25, deadline=None)
@given(index_data=contents, data=contents)
def test_the_index_blob_keeps_crlf_as_git_add_does(tmp_path_factory, index_data: bytes, data: bytes) -> None:
    repo = repo_with_rules(tmp_path_factory.getbasetemp() / "eol-index")
    blob = git(repo, "hash-object", "-w", "--no-filters", "--stdin", input=index_data)
    git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},auto.txt")
    (repo / "auto.txt").write_bytes(data)
    git_run(repo, "-c", "core.safecrlf=false", "add", "auto.txt")
    stored = git(repo, "ls-files", "-s", "auto.txt").split()[1]
    assert str(pygit2.hash(to_git(data, AUTO, lambda: index_data))) == stored
    assert has_crlf(index_data) == (b"\r\n" in index_data and not _looks_binary_to_git(repo, index_data))


def _looks_binary_to_git(repo: Path, data: bytes) -> bool:
    """Whether git's text=auto leaves ``data`` as it is (a CRLF file it would otherwise convert)."""
    return git(repo, "hash-object", "--path=auto.txt", "--stdin", input=data) == str(pygit2.hash(data))
