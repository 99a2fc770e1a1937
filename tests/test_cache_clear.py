"""`dlvm-eq cache clear` removes the cache's own files and nothing else: not through a symbolic
link (a home directory behind one keeps .bashrc, .ssh and Documents), not in a directory that
is not marked as the cache and holds other files, not a foreign file or folder inside the
cache, not what a link inside it points to. It says what it kept."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from dlvm_eq import cache as cache_mod
from dlvm_eq.cache import MAGIC, MARKER, DiskCache, UntrustedCache
from dlvm_eq.cli import main

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["ab" * 32, "cd" * 32, "ef" * 32]


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(cache_mod, "_warned", set())  # each test sees its own warnings


def _home(base: Path) -> dict[Path, bytes]:
    """A fake home directory's precious files."""
    files = {
        base / ".bashrc": b"export PATH=$HOME/bin:$PATH\n",
        base / ".ssh" / "id_ed25519": b"-----BEGIN OPENSSH PRIVATE KEY-----\n",
        base / "Documents" / "thesis.txt": b"Chapter 1\n",
    }
    for p, data in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return files


def _intact(files: dict[Path, bytes]) -> None:
    for p, data in files.items():
        assert p.read_bytes() == data, p


def _cli(capsys, monkeypatch, root, *argv):
    monkeypatch.setattr(cache_mod, "_shared", DiskCache(root))
    code = main(["cache", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _filled(root: Path) -> DiskCache:
    cache = DiskCache(root)
    for kind in ("cpu", "plan", "ir-optimize"):
        for key in KEYS:
            cache.put(kind, key, f"{kind} {key}".encode())
    return cache


def test_a_home_directory_behind_a_symlink_is_not_the_cache(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    files = _home(home)
    link = tmp_path / "cache-link"
    link.symlink_to(home, target_is_directory=True)
    code, out, err = _cli(capsys, monkeypatch, link, "info")
    assert code == 0 and "trusted" not in out
    assert f"NOT USED: {link} is a symbolic link (to {home})" in out
    code, out, err = _cli(capsys, monkeypatch, link, "clear")
    assert code == 1 and out == ""
    assert err.startswith("dlvm-eq: error: not clearing it: ") and "symbolic link" in err
    assert len(err.strip().splitlines()) == 1
    _intact(files)
    # nor is it written through (`info` above gave this process's one warning: a new one)
    monkeypatch.setattr(cache_mod, "_warned", set())
    with pytest.warns(UntrustedCache, match="symbolic link"):
        DiskCache(link).put("plan", KEYS[0], b"x")
    assert sorted(p.name for p in home.iterdir()) == [".bashrc", ".ssh", "Documents"]


def test_the_env_var_pointing_at_a_symlinked_home(tmp_path):
    """The reported case, as typed: DLVM_EQ_CACHE_DIR=<link to home> dlvm-eq cache clear."""
    home = tmp_path / "home"
    files = _home(home)
    link = tmp_path / "cache-link"
    link.symlink_to(home, target_is_directory=True)
    env = dict(os.environ, DLVM_EQ_CACHE_DIR=str(link), PYTHONPATH=str(ROOT))
    for action, code in (("info", 0), ("clear", 1)):
        r = subprocess.run(
            [sys.executable, "-m", "dlvm_eq.cli", "cache", action],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == code, r.stderr
        assert "Traceback" not in r.stderr and "trusted" not in r.stdout
    _intact(files)


def test_a_directory_that_is_not_marked_and_holds_other_files(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    files = _home(home)
    code, out, _ = _cli(capsys, monkeypatch, home, "info")
    assert f"NOT USED: {home} is not a dlvm_eq cache: it has no {MARKER}" in out
    assert ".bashrc, .ssh, Documents" in out
    code, out, err = _cli(capsys, monkeypatch, home, "clear")
    assert code == 1 and "not a dlvm_eq cache" in err
    monkeypatch.setattr(cache_mod, "_warned", set())
    with pytest.warns(UntrustedCache, match="not a dlvm_eq cache"):
        DiskCache(home).put("plan", KEYS[0], b"x")
    assert not (home / "plan").exists() and not (home / MARKER).exists()
    _intact(files)
    other = tmp_path / "other-tool"
    other.mkdir()
    (other / MARKER).write_text("Signature: 8a477f597d28d172789f06886806bc55\n# not ours\n")
    code, _, err = _cli(capsys, monkeypatch, other, "clear")
    assert code == 1 and "is not dlvm_eq's" in err and (other / MARKER).exists()


def test_clear_keeps_foreign_files_folders_and_link_targets(tmp_path, capsys, monkeypatch):
    root = tmp_path / "cache"
    cache = _filled(root)
    assert (root / MARKER).read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")
    outside = tmp_path / "outside"
    precious = _home(outside)
    framed = outside / "framed.bin"  # our own format, outside the cache
    framed.write_bytes(MAGIC + bytes(32) + b"data")
    precious[framed] = framed.read_bytes()
    foreign = {
        root / "NOTES.txt": b"my notes",
        root / "data" / "train.csv": b"1,2,3\n",
        root / "data" / "ab" / "results.bin": MAGIC + b"not at an entry's place",
        root / "cpu" / "ab" / "README": b"not an entry's name",
        root / "cpu" / "ab" / f"{'ab' * 32}.txt": MAGIC + b"not an entry's name",
        root / "plan" / "cd" / f"{'cd' * 31}ff.bin": b"an entry's name, not its header",
    }
    for p, data in foreign.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (root / "empty").mkdir()  # a folder with a kind's name, of someone else
    links = {
        root / "cpu" / "ef" / f"{'ef' * 31}00.bin": framed,  # a link at an entry's place
        root / "plan" / "home": outside,
        root / "linked-kind": outside,
        root / "ir-optimize" / "00": outside / ".ssh",
    }
    for p, target in links.items():
        p.symlink_to(target)
    stale = root / "lark" / "dlvm-grammar-0123abcd.lark.pickle"
    stale.parent.mkdir()
    stale.write_bytes(b"\x80\x04old lark cache")
    leftover = root / "plan" / "ab" / ".tmp-x1y2z3"  # a write cut short
    leftover.write_bytes(MAGIC[:2])
    profile = root / "profiles" / "cpu.json"
    profile.parent.mkdir()
    profile.write_text('{"target": "cpu"}')

    code, out, _ = _cli(capsys, monkeypatch, root, "info")
    assert "(trusted: private to you)" in out and "in 9 entries" in out
    assert "stale: 1 file" in out and f"other: {len(foreign) + len(links) + 1} files" in out

    code, out, err = _cli(capsys, monkeypatch, root, "clear")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"removed 11 files from {root}"  # 9 entries, the stale one, the leftover
    assert (
        lines[1] == "kept the machine profile profiles/cpu.json (`dlvm-eq calibrate` measured it)"
    )
    assert lines[2].startswith(f"kept {len(foreign) + len(links) + 1} files that are not")
    for name in ("NOTES.txt", "data/train.csv", "empty/", "ir-optimize/00", "and 3 more"):
        assert name in lines[2]  # the first 8 in order, then a count
    for p, data in foreign.items():
        assert p.read_bytes() == data, p
    for p, target in links.items():
        assert p.is_symlink() and os.readlink(p) == str(target)
    _intact(precious)
    assert (root / "empty").is_dir() and profile.exists() and (root / MARKER).exists()
    assert not stale.exists() and not leftover.exists()
    for kind in ("cpu", "plan", "ir-optimize"):
        for key in KEYS:
            assert not cache.path(kind, key).exists()
    assert not (root / "lark").exists() and not (root / "ir-optimize" / "ab").exists()
    # and the cache works on
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DiskCache(root).put("plan", KEYS[0], b"again")
        assert DiskCache(root).get("plan", KEYS[0]) == b"again"


def test_a_cache_from_before_markers_is_adopted(tmp_path, capsys, monkeypatch):
    """An unmarked directory holding only the cache's layout is the cache: used, marked on the
    first write, cleared."""
    root = tmp_path / "cache"
    _filled(root)
    (root / MARKER).unlink()
    assert DiskCache(root).get("plan", KEYS[1]) == f"plan {KEYS[1]}".encode()
    assert not (root / MARKER).exists()  # reading marks nothing
    code, out, _ = _cli(capsys, monkeypatch, root, "clear")
    assert code == 0 and out == f"removed 9 files from {root}\n"
    assert list(root.iterdir()) == []
    code, out, _ = _cli(capsys, monkeypatch, tmp_path / "absent", "clear")
    assert code == 0 and out.startswith("removed 0 files")
    DiskCache(root).put("plan", KEYS[0], b"x")
    assert (root / MARKER).exists()
