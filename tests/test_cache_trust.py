"""The compile cache holds data, lives in a private directory, and is never a way to run code:
planted pickles (old and new entry format), planted object code and a cache directory others
can write all lead to no code run, no crash, and a correct result computed without the entry."""

import hashlib
import json
import os
import pickle
import stat
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from dlvm_eq.cache import MAGIC, MARKER, DiskCache, UntrustedCache

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import json
    import numpy as np
    import dlvm_eq as dq
    from dlvm_eq.ir import function_cache as ir_cache
    from dlvm_eq.codegen import stats
    from dlvm_eq.pipeline import planning as backend
    def f(w, x):
        return dq.sum(dq.tanh(x @ w) ** 2)
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    x = np.linspace(0, 2, 20, dtype=np.float32).reshape(5, 4)
    # a reduction after the gradient keeps the module's own e-graph pass (issue 32), so that
    # both IR cache levels (ir-adjoint, ir-optimize) are written
    g = dq.jit(lambda w, x: dq.sum(dq.grad(f)(w, x) * w))(w, x)
    t = np.tanh(x.astype(np.float64) @ w)
    expected = np.sum(x.T @ (2 * t * (1 - t ** 2)) * w)
    assert np.allclose(g, expected, rtol=1e-4, atol=1e-5), (g, expected)
    print(json.dumps({"ir": [ir_cache.stats.hits, ir_cache.stats.misses],
                      "plan": [backend.plan_cache_stats["hits"], backend.plan_cache_stats["misses"]],
                      "kernels": stats()}))
""")


def _env(cache_dir):
    env = dict(os.environ, DLVM_EQ_CACHE_DIR=str(cache_dir), PYTHONPATH=str(ROOT))
    env.pop("DLVM_EQ_NO_IR_CACHE", None)
    return env


def _child(cache_dir):
    r = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=_env(cache_dir),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr}"  # a crash (segfault) is -11
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def _check_cli(cache_dir):
    r = subprocess.run(
        [sys.executable, "-m", "dlvm_eq.cli", "check", str(ROOT / "examples" / "mlp.dl")],
        env=_env(cache_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok: 2 functions"
    return r.stderr


class _Plant:
    """Unpickling this creates the marker file: the proof that a pickle ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _entries(cache_dir):
    return sorted(p for p in Path(cache_dir).rglob("*.bin") if p.is_file())


def _plant_everywhere(cache_dir, payload_for) -> int:
    """Overwrite every entry with payload_for(path) (bytes written as they are)."""
    entries = _entries(cache_dir)
    for p in entries:
        p.write_bytes(payload_for(p))
    return len(entries)


def _framed(magic: bytes, payload: bytes, p: Path | None = None) -> bytes:
    """An entry file as the cache writes it; for the current format at `p`, the body records
    the kind and key of that place (a planted file that passes every check but its content)."""
    if p is not None and magic == MAGIC:
        payload = f"{p.parent.parent.name}/{p.stem}".encode() + b"\n" + payload
    return magic + hashlib.sha256(payload).digest() + payload


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """A cache filled by one cold compile (and one `check`, for the parser tables)."""
    d = tmp_path_factory.mktemp("cold") / "cache"
    stats, _ = _child(d)
    assert stats["ir"][1] >= 1 and stats["plan"] == [0, 1] and stats["kernels"]["compiled"] >= 1
    _check_cli(d)
    kinds = {p.parent.parent.name for p in _entries(d)}
    assert {"plan", "ir-optimize", "ir-adjoint", "cpu", "lark"} <= kinds, kinds
    return d


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("magic", [b"DQK1", MAGIC], ids=["old-format", "current-format"])
def test_planted_pickles_never_run(cold, tmp_path, magic):
    cache_dir = _copy(cold, tmp_path / "cache")
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Plant(marker))
    n = _plant_everywhere(cache_dir, lambda p: _framed(magic, evil, p))
    assert n >= 5
    # the payload is live: unpickling it does create the marker (then we remove it)
    pickle.loads(evil)
    assert marker.exists()
    marker.unlink()
    stats, _ = _child(cache_dir)
    _check_cli(cache_dir)  # the parser's tables are read under `check`
    assert not marker.exists()
    assert stats["ir"][0] == 0 and stats["plan"] == [0, 1]  # no entry used
    assert stats["kernels"]["loaded_from_disk"] == 0 and stats["kernels"]["compiled"] >= 1


def _real_object(cache_dir) -> tuple[Path, dict, bytes]:
    for p in _entries(cache_dir):
        if p.parent.parent.name != "cpu":
            continue
        body = p.read_bytes()[len(MAGIC) + 32 :]
        label, _, payload = body.partition(b"\n")
        assert label == f"cpu/{p.stem}".encode()
        head, _, obj = payload.partition(b"\n")
        return p, json.loads(head), obj
    raise AssertionError("no object code in the cache")


@pytest.mark.parametrize(
    "damage", ["garbage", "elf-garbage", "truncated", "other-symbol", "other-host"]
)
def test_planted_object_code_is_not_loaded(cold, tmp_path, damage):
    cache_dir = _copy(cold, tmp_path / "cache")
    _, meta, real = _real_object(cache_dir)

    def payload(p):
        obj = {
            "garbage": os.urandom(4096),
            "elf-garbage": b"\x7fELF\x02\x01\x01" + b"\xff" * 4089,
            "truncated": real[: len(real) // 2],
        }.get(damage, real)
        m = dict(meta, sha256=hashlib.sha256(obj).hexdigest())
        if damage == "other-symbol":
            m["symbol"] = "dq_not_this_one"
        if damage == "other-host":
            m["host"] = "x86_64-unknown-linux-gnu|some other cpu"
        # a valid entry checksum, and a valid header checksum for the bytes planted
        return _framed(MAGIC, json.dumps(m).encode() + b"\n" + obj, p)

    n = _plant_everywhere(cache_dir / "cpu", payload)
    assert n >= 1
    stats, _ = _child(cache_dir)  # exit 0: no crash; the result checked in the child
    assert stats["kernels"]["loaded_from_disk"] == 0
    assert stats["kernels"]["compiled"] >= 1


def test_a_cache_others_can_write_is_not_used(cold, tmp_path):
    cache_dir = _copy(cold, tmp_path / "cache")
    marker = tmp_path / "pwned"
    _plant_everywhere(cache_dir, lambda p: _framed(b"DQK1", pickle.dumps(_Plant(marker))))
    before = {p: p.read_bytes() for p in _entries(cache_dir)}
    os.chmod(cache_dir, 0o777)
    stats, err = _child(cache_dir)
    assert "not using the compile cache" in err and "writable by others" in err
    assert err.count("not using the compile cache") == 1  # warned once
    assert stats["ir"] == [0, 2] and stats["plan"] == [0, 1]
    assert stats["kernels"]["loaded_from_disk"] == 0
    assert "writable by others" in _check_cli(cache_dir)
    assert not marker.exists()
    assert {p: p.read_bytes() for p in _entries(cache_dir)} == before  # nothing written either


def test_group_writable_subdirectory_and_entry_are_not_used(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path / "c")
    cache.put("plan", "ab" * 32, b"payload")
    assert cache.get("plan", "ab" * 32) == b"payload"
    entry = cache.path("plan", "ab" * 32)
    os.chmod(entry, 0o666)
    with pytest.warns(UntrustedCache, match="writable by others"):
        assert DiskCache(tmp_path / "c").get("plan", "ab" * 32) is None
    os.chmod(entry, 0o600)
    os.chmod(entry.parent, 0o770)
    with pytest.warns(UntrustedCache, match="writable by its group"):
        assert DiskCache(tmp_path / "c").get("plan", "ab" * 32) is None
    os.chmod(entry.parent, 0o700)
    assert DiskCache(tmp_path / "c").get("plan", "ab" * 32) == b"payload"
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1)  # now the files are someone else's
    with pytest.warns(UntrustedCache, match="owned by another user"):
        assert DiskCache(tmp_path / "c").get("plan", "ab" * 32) is None


def test_directories_are_private_under_any_umask(tmp_path):
    old = os.umask(0)
    try:
        cache = DiskCache(tmp_path / "new" / "cache")
        cache.put("cpu", "cd" * 32, b"x")
    finally:
        os.umask(old)
    p = cache.path("cpu", "cd" * 32)
    for d in (cache.root, p.parent.parent, p.parent):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # trusted: no warning
        assert DiskCache(cache.root).get("cpu", "cd" * 32) == b"x"


def test_cache_info_and_clear(cold, tmp_path, capsys, monkeypatch):
    from dlvm_eq import cache as cache_mod
    from dlvm_eq.cli import main

    cache_dir = _copy(cold, tmp_path / "cache")
    (cache_dir / "lark" / "dlvm-grammar-0a1b.lark.pickle").write_bytes(b"\x80\x04old lark")
    monkeypatch.setattr(cache_mod, "_shared", DiskCache(cache_dir))
    n = len(_entries(cache_dir))
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"cache: {cache_dir} (trusted: private to you)" in out
    assert f"in {n} entries" in out
    counts = {
        line.split()[0]: int(line.split()[1]) for line in out.splitlines() if line.startswith("  ")
    }
    assert counts["plan"] == 1 and counts["cpu"] >= 1 and sum(counts.values()) == n
    assert "stale: 1 file of an older format" in out
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out.strip() == f"removed {n + 1} files from {cache_dir}"
    assert [p.name for p in cache_dir.rglob("*")] == [MARKER] and cache_dir.is_dir()
    assert main(["cache", "info"]) == 0
    assert "0 B in 0 entries" in capsys.readouterr().out
    os.chmod(cache_dir, 0o777)
    assert main(["cache", "info"]) == 0
    assert "NOT USED: cache directory" in capsys.readouterr().out
    os.chmod(cache_dir, 0o700)


def test_elf_checks_on_real_object_code(cold):
    from dlvm_eq.codegen.runtime.object_check import elf_problem

    _, meta, obj = _real_object(cold)
    arch = meta["host"].split("-", 1)[0]
    assert elf_problem(obj, meta["symbol"], arch) is None
    assert "not defined" in elf_problem(obj, "dq_missing", arch)
    assert elf_problem(obj[: len(obj) // 2], meta["symbol"], arch) is not None
    assert elf_problem(b"\x7fELF" + bytes(60), meta["symbol"], arch) is not None
    shoff = int.from_bytes(obj[40:48], "little")
    bad = bytearray(obj)
    bad[40:48] = (len(obj) - 10).to_bytes(8, "little")  # section headers past the end
    assert elf_problem(bytes(bad), meta["symbol"], arch) == "section headers out of range"
    bad = bytearray(obj)
    bad[shoff + 64 + 24 : shoff + 64 + 32] = (len(obj) * 4).to_bytes(
        8, "little"
    )  # a section's offset
    assert elf_problem(bytes(bad), meta["symbol"], arch) is not None
    assert elf_problem(obj, meta["symbol"], "aarch64" if arch == "x86_64" else "x86_64") is not None


def test_records_keep_sharing_and_refuse_what_is_not_in_the_schema():
    from dlvm_eq.ir.function_cache import FUNCTION_SCHEMA
    from dlvm_eq.ir.parser import parse
    from dlvm_eq.json_records import RecordError

    m = parse(
        textwrap.dedent("""
        module "m"
        stage raw
        func @f: (<2 x f32>) -> <2 x f32> {
        'entry(%x: <2 x f32>):
            %0 = exp %x: <2 x f32>
            %1 = multiply %0: <2 x f32>, %x: <2 x f32>
            return %1: <2 x f32>
        }""")
    )
    f = m["f"]
    g = FUNCTION_SCHEMA.loads(FUNCTION_SCHEMA.dumps(f))
    assert g.body[1].operands[0] is g.body[0].result and g.body[1].operands[1] is g.params[0]
    assert str(g) == str(f)
    text = FUNCTION_SCHEMA.dumps(f)
    for evil in (
        text.replace('"Instruction"', '"os.system"'),
        text.replace('"version":1', '"version":2'),
        json.dumps({"schema": FUNCTION_SCHEMA.name, "version": 1, "objects": [], "root": {"$": 0}}),
        json.dumps(
            {
                "schema": FUNCTION_SCHEMA.name,
                "version": 1,
                "objects": [],
                "root": {"a": ["|O", [1], "AAAAAAAAAAA="]},
            }
        ),
        '{"schema":"%s","version":1,"objects":[],"root":%s}'
        % (FUNCTION_SCHEMA.name, "[" * 100_000 + "]" * 100_000),
    ):
        with pytest.raises(RecordError):
            FUNCTION_SCHEMA.loads(evil)
    with pytest.raises(RecordError):
        FUNCTION_SCHEMA.dumps(np.array([object()]))


def test_no_pickle_in_the_package():
    for p in (ROOT / "dlvm_eq").rglob("*.py"):
        text = p.read_text()
        for word in (
            "import pickle",
            "import marshal",
            "import shelve",
            "pickle.load",
            "marshal.load",
        ):
            assert word not in text, f"{p}: {word}"
