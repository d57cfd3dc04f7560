"""Real full and read-only disks for tests: small tmpfs mounts (we run as root here and in CI).

chmod does not stop root from writing, so a read-only folder has to be a
read-only file system; a full disk is a tmpfs of a few hundred kilobytes.
Where mounting is not allowed (not root, no CAP_SYS_ADMIN) the tests that
need one are skipped with that reason.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest


def _mount(*arguments: str) -> None:
    subprocess.run(["mount", *arguments], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def small_disk(where: Path, size_kib: int = 512):
    """A tmpfs of `size_kib` KiB at `where` (a real disk that fills up); unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        _mount("-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(where))
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot mount a tmpfs here: {getattr(error, 'stderr', error)}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def make_read_only(where: Path) -> None:
    """Remount the tmpfs at `where` read-only (what a read-only disk does to every writer, root included)."""
    _mount("-o", "remount,ro", str(where))


def make_writable(where: Path) -> None:
    _mount("-o", "remount,rw", str(where))


def fill(where: Path) -> Path:
    """Fill the disk at `where` to the last byte; returns the filler file (delete it to free the space)."""
    filler = where / "filler"
    with open(filler, "wb", buffering=0) as file:
        chunk = b"\0" * 4096
        try:
            while True:
                file.write(chunk)
        except OSError:
            pass
    with open(filler, "ab", buffering=0) as file:  # the last partial block
        try:
            while True:
                file.write(b"\0")
        except OSError:
            pass
    return filler
