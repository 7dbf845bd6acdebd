"""Triton's installation hash is remembered across processes, and recomputed by Triton's own
function whenever a file it covers changes."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
import triton.runtime.cache as triton_cache

from attncc.runtime import triton_key


def fake_triton(root: Path) -> Path:
    for name in ("runtime/cache.py", "compiler/compiler.py", "language/core.py", "_C/lib.so"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    (root / "language" / "__pycache__").mkdir()
    return root


class Counted:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        return f"key-{self.calls}"


def test_a_later_process_reads_the_key_without_hashing(tmp_path: Path) -> None:
    root, memo_dir = fake_triton(tmp_path / "triton"), tmp_path / "memo"
    original = Counted()
    assert triton_key.remembered(original, root, "3.6.0", memo_dir)() == "key-1"
    # a new process: a new memo over the same files
    assert triton_key.remembered(original, root, "3.6.0", memo_dir)() == "key-1"
    assert original.calls == 1
    assert len(list(memo_dir.iterdir())) == 1


@pytest.mark.parametrize("change", ["edit", "add", "remove", "version"])
def test_any_change_to_the_hashed_files_recomputes(tmp_path: Path, change: str) -> None:
    root, memo_dir = fake_triton(tmp_path / "triton"), tmp_path / "memo"
    original = Counted()
    triton_key.remembered(original, root, "3.6.0", memo_dir)()
    version = "3.6.0"
    if change == "edit":
        (root / "_C" / "lib.so").write_text("a rebuilt library")
    elif change == "add":
        (root / "backends" / "nvidia").mkdir(parents=True)
        (root / "backends" / "nvidia" / "__init__.py").write_text("")
    elif change == "remove":
        (root / "language" / "core.py").unlink()
    else:
        version = "3.7.0"
    assert triton_key.remembered(original, root, version, memo_dir)() == "key-2"
    assert original.calls == 2


def test_bytecode_files_do_not_invalidate(tmp_path: Path) -> None:
    root, memo_dir = fake_triton(tmp_path / "triton"), tmp_path / "memo"
    original = Counted()
    triton_key.remembered(original, root, "3.6.0", memo_dir)()
    (root / "language" / "__pycache__" / "core.cpython-312.pyc").write_bytes(b"\0")
    assert triton_key.remembered(original, root, "3.6.0", memo_dir)() == "key-1"


def test_files_triton_does_not_hash_do_not_invalidate(tmp_path: Path) -> None:
    """Headers, binaries and folders that are not packages: walk_packages never reads them."""
    root, memo_dir = fake_triton(tmp_path / "triton"), tmp_path / "memo"
    (root / "backends" / "nvidia" / "include").mkdir(parents=True)
    (root / "backends" / "nvidia" / "__init__.py").write_text("")
    original = Counted()
    triton_key.remembered(original, root, "3.6.0", memo_dir)()
    (root / "backends" / "nvidia" / "include" / "cuda.h").write_text("a header")
    (root / "backends" / "nvidia" / "include" / "tool.py").write_text("not in a package")
    (root / "backends" / "nvidia" / "ptxas.bin").write_bytes(b"\0")
    assert triton_key.remembered(original, root, "3.6.0", memo_dir)() == "key-1"
    (root / "backends" / "nvidia" / "driver.py").write_text("a module of a package")
    assert triton_key.remembered(original, root, "3.6.0", memo_dir)() == "key-2"


def test_an_unwritable_cache_still_gives_the_right_key(tmp_path: Path) -> None:
    root = fake_triton(tmp_path / "triton")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    original = Counted()
    memo = triton_key.remembered(original, root, "3.6.0", blocker / "memo")
    assert memo() == "key-1" and memo() == "key-1"  # cached in the process


def test_installed_memo_returns_tritons_own_key(tmp_path: Path) -> None:
    """In a fresh process (the patch is process-wide): the memo's value is Triton's, computed
    once and then read back by a second process; disabled, Triton is left alone."""
    script = (
        "import triton.runtime.cache as c\n"
        "from attncc.runtime import triton_key\n"
        "original = c.triton_key\n"
        "triton_key.install()\n"
        "print(c.triton_key is original, c.triton_key() == original())\n"
    )
    env = {**os.environ, "ATTNCC_CACHE_DIR": str(tmp_path)}
    run = [sys.executable, "-c", script]
    first = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
    assert first.stdout.split() == ["False", "True"]
    assert len(list((tmp_path / "triton_key").iterdir())) == 1
    off = subprocess.run(
        run, env={**env, "ATTNCC_TRITON_KEY_MEMO": "0"}, capture_output=True, text=True
    )
    assert off.stdout.split() == ["True", "True"]


def test_the_memo_covers_every_file_triton_hashes() -> None:
    """The files triton_key() reads, found the way it finds them (pkgutil.walk_packages)."""
    root = Path(triton_cache.__file__).resolve().parents[1]
    covered = {p.resolve() for p in triton_key.hashed_files(root)}
    assert Path(triton_cache.__file__).resolve() in covered
    libtriton = [p for p in (root / "_C").iterdir() if p.name.startswith("libtriton.")]
    assert libtriton and all(p.resolve() in covered for p in libtriton)
    for package in ("compiler", "backends", "language"):
        origins = []
        for module in pkgutil.walk_packages([str(root / package)], prefix=f"triton.{package}."):
            spec = module.module_finder.find_spec(module.name)  # type: ignore[call-arg]
            assert spec is not None and spec.origin is not None
            origins.append(Path(spec.origin))
        assert origins and all(p.resolve() in covered for p in origins)


def test_installs_from_two_threads_make_one_memo(tmp_path: Path) -> None:
    """attncc.runtime.triton_warm's thread and the first module load both install: one memo
    between them (a second would compute or read the hash again)."""
    script = (
        "import threading, time\n"
        "import triton.runtime.cache as c\n"
        "from attncc.runtime import triton_key\n"
        "made, original = [], triton_key.remembered\n"
        "def slow(*args):\n"
        "    made.append(1)\n"
        "    time.sleep(0.05)\n"
        "    return original(*args)\n"
        "triton_key.remembered = slow\n"
        "threads = [threading.Thread(target=triton_key.install) for _ in range(8)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(len(made), c.triton_key.attncc_memo)\n"
    )
    env = {**os.environ, "ATTNCC_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["1", "True"]
