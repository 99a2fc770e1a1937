"""Digests of source and rule files for cache keys (dlvm_eq/digests.py): the digest read back
under the files' stat signature is the digest of their contents, and any edit (even one that
keeps the size and puts the mtime back) is seen, because it changes the ctime."""

from __future__ import annotations

import os
import time

from dlvm_eq.cache import DiskCache
from dlvm_eq.digests import content_digest, digest_stats, files_digest, tree_digest, tree_files


def _tree(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "sub" / "b.lark").write_text("start: NAME\n")
    (tmp_path / "pkg" / "notes.txt").write_text("not hashed")
    return tree_files(tmp_path / "pkg")


def test_files_digest_is_the_content_digest_read_once(tmp_path):
    files = _tree(tmp_path)
    assert [n for n, _ in files] == ["/a.py", "sub/b.lark"]
    cache = DiskCache(tmp_path / "cache")
    want = content_digest(files)
    assert want == tree_digest(tmp_path / "pkg")
    before = dict(digest_stats)
    assert files_digest(files, cache) == want  # read, then remembered
    assert files_digest(files, cache) == want  # from the cache: no file read
    assert digest_stats["read"] == before["read"] + 1
    assert digest_stats["stat"] == before["stat"] + 1


def test_an_edit_that_keeps_size_and_mtime_is_seen(tmp_path):
    files = _tree(tmp_path)
    cache = DiskCache(tmp_path / "cache")
    first = files_digest(files, cache)
    path = files[0][1]
    st = os.stat(path)
    time.sleep(0.05)  # a ctime of its own where timestamps are jiffy-granular
    with open(path, "w") as f:
        f.write("x = 2\n")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns
    edited = files_digest(files, cache)
    assert edited != first and edited == content_digest(files)


def test_a_damaged_entry_is_recomputed(tmp_path):
    files = _tree(tmp_path)
    cache = DiskCache(tmp_path / "cache")
    want = files_digest(files, cache)
    (entry,) = (tmp_path / "cache" / "digest").rglob("*.bin")
    cache.put("digest", entry.stem, b"not a digest")  # a valid checksum, wrong payload
    assert files_digest(files, cache) == want
