"""Before Qt starts on X11: are the system libraries its xcb plugin needs installed?

PySide6 6.5+ bundles Qt but not the xcb helper libraries; a minimal Linux install
lacks some of them, and Qt then aborts with "could not load the Qt platform plugin
xcb", which names none of them. This module tries to load each one (by soname,
with ctypes, as Qt's plugin would) and turns what is missing into one line that
says what to install. No Qt here: it runs before PySide6 creates anything.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SystemLibrary:
    soname: str
    apt: str  # Debian / Ubuntu package
    dnf: str  # Fedora
    pacman: str  # Arch


XCB_LIBRARIES = (
    SystemLibrary("libxcb-cursor.so.0", "libxcb-cursor0", "xcb-util-cursor", "xcb-util-cursor"),
    SystemLibrary("libxcb-icccm.so.4", "libxcb-icccm4", "xcb-util-wm", "xcb-util-wm"),
    SystemLibrary("libxcb-keysyms.so.1", "libxcb-keysyms1", "xcb-util-keysyms", "xcb-util-keysyms"),
    SystemLibrary("libxcb-image.so.0", "libxcb-image0", "xcb-util-image", "xcb-util-image"),
    SystemLibrary("libxcb-render-util.so.0", "libxcb-render-util0", "xcb-util-renderutil", "xcb-util-renderutil"),
    SystemLibrary("libxkbcommon-x11.so.0", "libxkbcommon-x11-0", "libxkbcommon-x11", "libxkbcommon-x11"),
    SystemLibrary("libxcb-xkb.so.1", "libxcb-xkb1", "libxcb", "libxcb"),
    SystemLibrary("libxcb-shape.so.0", "libxcb-shape0", "libxcb", "libxcb"),
    SystemLibrary("libxcb-randr.so.0", "libxcb-randr0", "libxcb", "libxcb"),
    SystemLibrary("libEGL.so.1", "libegl1", "mesa-libEGL", "libglvnd"),
)

_INSTALL = {"apt": "sudo apt install", "dnf": "sudo dnf install", "pacman": "sudo pacman -S"}


def uses_xcb(environ, platform: str = sys.platform) -> bool:
    """Whether Qt would start its X11 plugin: on Linux with a display, unless told or likely to use another."""
    if not platform.startswith("linux") or not environ.get("DISPLAY"):
        return False
    chosen = environ.get("QT_QPA_PLATFORM", "")
    if chosen:
        return chosen.split(";")[0].split(":")[0] == "xcb"
    # Unset: Qt 6 prefers Wayland in a Wayland session and only falls back to xcb.
    return not environ.get("WAYLAND_DISPLAY")


def missing_libraries(libraries=XCB_LIBRARIES) -> list[SystemLibrary]:
    missing = []
    for library in libraries:
        try:
            ctypes.CDLL(library.soname)
        except OSError:
            missing.append(library)
    return missing


def package_manager(os_release: str | os.PathLike = "/etc/os-release") -> str:
    """apt, dnf or pacman, from /etc/os-release (apt when it cannot tell)."""
    try:
        text = Path(os_release).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "apt"
    names = set()
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key in ("ID", "ID_LIKE"):
            names.update(value.strip().strip("\"'").split())
    if names & {"fedora", "rhel", "centos"}:
        return "dnf"
    if names & {"arch", "manjaro"}:
        return "pacman"
    return "apt"


def missing_message(missing: list[SystemLibrary], manager: str = "apt") -> str:
    """One line: what is missing and the command that installs it."""
    packages = list(dict.fromkeys(getattr(library, manager) for library in missing))
    names = ", ".join(library.soname for library in missing)
    return (
        f"specdeck: Qt's X11 platform plugin (xcb) cannot start: missing system "
        f"{'library' if len(missing) == 1 else 'libraries'} {names}. "
        f"Install with: {_INSTALL[manager]} {' '.join(packages)}"
    )


def check_xcb_libraries(environ=None, libraries=None, os_release="/etc/os-release") -> str | None:
    """None when Qt can start (or will not use xcb); else the line to print."""
    if not uses_xcb(os.environ if environ is None else environ):
        return None
    missing = missing_libraries(XCB_LIBRARIES if libraries is None else libraries)
    return missing_message(missing, package_manager(os_release)) if missing else None
