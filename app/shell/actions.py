"""The main window's actions, menus and toolbar, in one place.

Every command exists once, as a QAction with its shortcut, and the menus and the
toolbar show the same objects, so enabling "Stop" enables it everywhere. This
module only makes them: the window connects each action's `triggered` to what
it does (MainWindow._connect_actions), so nothing here knows the window's parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QIcon, QKeySequence
from PySide6.QtWidgets import QDockWidget, QMainWindow, QMessageBox, QStyle, QToolBar

import app
from app.shell.numbers_help import open_numbers_help


@dataclass
class Actions:
    new_chat: QAction
    rename: QAction
    delete: QAction
    export_markdown: QAction
    export_png: QAction
    export_svg: QAction
    export_csv: QAction
    export_json: QAction
    quit: QAction
    salvage: QAction
    choose_models: QAction
    stop: QAction
    colour_tokens: QAction
    markdown: QAction
    regenerate: QAction
    system_prompt: QAction
    benchmark: QAction
    load_test: QAction
    train_heads: QAction
    numbers_help: QAction


def create_actions(window: QMainWindow, docks: Sequence[QDockWidget]) -> Actions:
    """The actions, in the window's menus and toolbar; `docks` get a View menu entry each."""

    def action(text: str, shortcut=None, icon: QIcon | None = None, tip: str = "") -> QAction:
        item = QAction(text, window)
        if shortcut is not None:
            item.setShortcut(QKeySequence(shortcut))
        if icon is not None:
            item.setIcon(icon)
        if tip:
            item.setStatusTip(tip)
            item.setToolTip(
                f"{tip} ({item.shortcut().toString(QKeySequence.SequenceFormat.NativeText)})"
                if shortcut is not None
                else tip
            )
        return item

    def standard(name: str) -> QIcon:
        return window.style().standardIcon(getattr(QStyle.StandardPixmap, name))

    actions = Actions(
        new_chat=action("&New chat", QKeySequence.StandardKey.New, standard("SP_FileIcon"), "Start a new conversation"),
        rename=action("&Rename chat", "F2"),
        delete=action("&Delete chat…"),
        export_markdown=action("&Export chat as Markdown…", "Ctrl+E"),
        export_png=action("Charts as &PNG…"),
        export_svg=action("Charts as &SVG, one file per panel…"),
        export_csv=action("Charts as &CSV…"),
        export_json=action("Charts as &JSON…"),
        quit=action("&Quit", QKeySequence.StandardKey.Quit),
        salvage=action(
            "Sal&vage conversations",
            None,
            None,
            "Copy every conversation that can still be read into a new database (when it is damaged)",
        ),
        choose_models=action(
            "&Model pair…",
            "Ctrl+M",
            standard("SP_DriveHDIcon"),
            "Choose the target and the drafter, and the sampling settings",
        ),
        stop=action("&Stop", "Esc", standard("SP_MediaStop"), "Stop the generation"),
        colour_tokens=action("&Colour tokens", "Ctrl+Shift+C", None, "Tint each token by where it came from"),
        markdown=action(
            "Replies as &Markdown",
            "Ctrl+Shift+M",
            None,
            "Draw finished replies as Markdown, tokens still in their colours; off: as written",
        ),
        regenerate=action("&Regenerate reply", "Ctrl+R", None, "Write the last reply again"),
        system_prompt=action(
            "S&ystem prompt…", None, None, "This chat's system prompt, and the one new chats start with"
        ),
        benchmark=action("&Benchmark…", None, None, "Time vanilla against speculative decoding on a set of prompts"),
        load_test=action(
            "&Load test…", None, None, "Speculative against plain decoding with many requests at once: the break-even B"
        ),
        train_heads=action("&Train heads…", None, None, "Train Medusa heads for a target on its own predictions"),
        numbers_help=action(
            "What the &numbers mean",
            QKeySequence.StandardKey.HelpContents,
            None,
            "Each figure in plain words, and the article's formula with your last reply's numbers",
        ),
    )
    actions.stop.setEnabled(False)
    actions.salvage.setEnabled(False)  # until the store finds damage
    # Esc stops a generation only from the chat and comparison panes: elsewhere (a title
    # being renamed in the list, a menu) it keeps its usual meaning, "cancel".
    actions.stop.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
    window.centralWidget().addAction(actions.stop)
    actions.colour_tokens.setCheckable(True)
    actions.colour_tokens.setChecked(True)
    actions.markdown.setCheckable(True)
    actions.markdown.setChecked(True)

    menus = window.menuBar()
    file_menu = menus.addMenu("&File")
    file_menu.addActions([actions.new_chat, actions.rename, actions.delete])
    file_menu.addSeparator()
    file_menu.addActions([actions.regenerate, actions.system_prompt])
    file_menu.addSeparator()
    file_menu.addAction(actions.export_markdown)
    charts_menu = file_menu.addMenu("Export c&harts")
    charts_menu.addActions([actions.export_png, actions.export_svg, actions.export_csv, actions.export_json])
    file_menu.addSeparator()
    file_menu.addAction(actions.salvage)
    file_menu.addSeparator()
    file_menu.addAction(actions.quit)

    models_menu = menus.addMenu("&Models")
    models_menu.addActions([actions.choose_models, actions.stop])
    models_menu.addAction(actions.benchmark)
    models_menu.addAction(actions.load_test)
    models_menu.addAction(actions.train_heads)

    view_menu = menus.addMenu("&View")
    view_menu.addAction(actions.colour_tokens)
    view_menu.addAction(actions.markdown)
    view_menu.addSeparator()
    for dock in docks:
        view_menu.addAction(dock.toggleViewAction())

    help_menu = menus.addMenu("&Help")
    help_menu.addAction(actions.numbers_help)
    # Opened here, as About is: the window gives its last run through last_run_stats() (numbers_help.py).
    actions.numbers_help.triggered.connect(lambda: open_numbers_help(window))
    help_menu.addSeparator()
    help_menu.addAction("&About SpecDeck", lambda: _about(window))

    toolbar = QToolBar("Main toolbar", window)
    toolbar.setObjectName("main_toolbar")
    toolbar.setMovable(False)
    toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
    # "Colour tokens" is not here: the check box beside the colour legend, under the chat, is
    # the one place it is shown (and View > Colour tokens, Ctrl+Shift+C).
    toolbar.addActions([actions.new_chat, actions.choose_models, actions.stop])
    window.addToolBar(toolbar)
    return actions


def _about(window: QMainWindow) -> None:
    QMessageBox.about(
        window,
        "About SpecDeck",
        f"<b>SpecDeck {app.__version__}</b><p>Speculative decoding of local language models: a drafter "
        "proposes tokens, the target checks them in one pass, and the output is exactly what the target "
        "alone would write, only sooner.</p><p>Token colours: green accepted draft, orange resampled, "
        "blue bonus, uncoloured plain target token.</p>",
    )
