"""Before Qt starts on X11: a missing system library is one line that says what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.shell import qt_platform

ROOT = Path(__file__).resolve().parents[3]
LIBC = qt_platform.SystemLibrary("libc.so.6", "libc6", "glibc", "glibc")
MISSING = qt_platform.SystemLibrary(
    "libspecdeck-missing.so.0", "libspecdeck-missing0", "specdeck-missing", "specdeck-missing"
)
X11 = {"DISPLAY": ":0"}


def test_a_missing_xcb_library_is_named_with_the_command_that_installs_it(tmp_path):
    debian = tmp_path / "os-release"
    debian.write_text('ID=debian\nVERSION_ID="12"\n')

    line = qt_platform.check_xcb_libraries(X11, [LIBC, MISSING], debian)

    assert line is not None and "\n" not in line
    assert "libspecdeck-missing.so.0" in line and "libc.so.6" not in line
    assert line.endswith("sudo apt install libspecdeck-missing0")


def test_fedora_and_arch_get_their_own_package_names(tmp_path):
    fedora, arch = tmp_path / "fedora", tmp_path / "arch"
    fedora.write_text("ID=fedora\n")
    arch.write_text('ID="arch"\n')

    assert qt_platform.check_xcb_libraries(X11, [MISSING], fedora).endswith("sudo dnf install specdeck-missing")
    assert qt_platform.check_xcb_libraries(X11, [MISSING], arch).endswith("sudo pacman -S specdeck-missing")


@pytest.mark.parametrize(
    "environ",
    [{}, {"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"}, {"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"}],
)
def test_no_check_where_qt_would_not_use_xcb(environ):
    assert qt_platform.check_xcb_libraries(environ, [MISSING]) is None


def test_every_debian_package_of_the_readme_is_checked():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    apt_line = next(line for line in readme.splitlines() if line.startswith("sudo apt install libxcb"))
    assert apt_line.split()[3:] == [library.apt for library in qt_platform.XCB_LIBRARIES]


def test_specdeck_prints_one_line_and_exits_instead_of_qts_abort():
    """The real entry point on an X display that lacks a library: one line on stderr, status 1."""
    script = (
        "import sys, app.shell.qt_platform as q; "
        "q.XCB_LIBRARIES += (q.SystemLibrary('libspecdeck-missing.so.0', 'libspecdeck-missing0', 'x', 'x'),); "
        "from app.__main__ import main; sys.exit(main([]))"
    )
    env = {"PATH": "/usr/bin:/bin", "DISPLAY": ":99", "HOME": "/nonexistent"}  # no X server at :99 either

    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "libspecdeck-missing.so.0" in lines[0] and "install" in lines[0], done.stderr
    assert "could not load the Qt platform plugin" not in done.stderr
