"""The list of saved conversations (a dock beside the chat).

Most recent first. Renaming edits the title in place (F2 or double-click);
everything that changes the store goes out as a signal, so the main window stays
the only writer of the store.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtWidgets import QAbstractItemView, QListWidget, QListWidgetItem, QMenu, QVBoxLayout, QWidget

from app.chat.conversations import Conversation

ID_ROLE = Qt.ItemDataRole.UserRole


def _when(timestamp: float) -> str:
    """'14:02' today, 'Mar 3' this year, '2024-03-03' before."""
    then, now = time.localtime(timestamp), time.localtime()
    if then[:3] == now[:3]:
        return time.strftime("%H:%M", then)
    if then.tm_year == now.tm_year:
        return time.strftime("%b %d", then)
    return time.strftime("%Y-%m-%d", then)


class _ConversationList(QListWidget):
    """A QListWidget that takes focus without choosing a conversation.

    Given focus with no current row, Qt makes the first row current, and the panel would
    open that conversation. Focus comes here without the user asking when the widget
    that had it is disabled: the Send button the user clicked, while a model pair loads.
    A new, empty chat was then replaced by the latest saved one, and the next message
    went on with it."""

    def focusInEvent(self, event) -> None:
        none_chosen = self.currentItem() is None
        blocked = self.blockSignals(none_chosen or self.signalsBlocked())
        try:
            super().focusInEvent(event)
            if none_chosen:
                self.setCurrentItem(None)
        finally:
            self.blockSignals(blocked)


class ConversationPanel(QWidget):
    """Saved chats; selecting one opens it."""

    sig_selected = Signal(str)
    """The user picked a conversation (its id)."""

    sig_renamed = Signal(str, str)
    """The user edited a title: id, new title."""

    sig_delete_requested = Signal(str)
    """The user asked to delete a conversation (its id)."""

    sig_export_requested = Signal(str)
    """The user asked to export a conversation as Markdown (its id)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.list = _ConversationList()
        self.list.setEditTriggers(
            QAbstractItemView.EditTrigger.EditKeyPressed | QAbstractItemView.EditTrigger.DoubleClicked
        )
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setUniformItemSizes(True)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.list)
        self.list.currentItemChanged.connect(self._on_current_changed)
        self.list.itemChanged.connect(self._on_item_changed)
        self.list.customContextMenuRequested.connect(self._show_menu)

    def set_conversations(self, conversations: list[Conversation], current_id: str | None) -> None:
        self.list.blockSignals(True)  # filling the list is not the user choosing or renaming
        try:
            self.list.clear()
            for conversation in conversations:
                item = QListWidgetItem(conversation.title)
                item.setData(ID_ROLE, conversation.id)
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
                item.setToolTip(f"{conversation.title}\nlast change {_when(conversation.updated)}")
                self.list.addItem(item)
                if conversation.id == current_id:
                    self.list.setCurrentItem(item)
        finally:
            self.list.blockSignals(False)

    def current_id(self) -> str | None:
        item = self.list.currentItem()
        return item.data(ID_ROLE) if item else None

    def titles(self) -> list[str]:
        return [self.list.item(row).text() for row in range(self.list.count())]

    def edit_current(self) -> None:
        if self.list.currentItem() is not None:
            self.list.editItem(self.list.currentItem())

    def _on_current_changed(self, current: QListWidgetItem | None, _previous) -> None:
        if current is not None:
            self.sig_selected.emit(current.data(ID_ROLE))

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        title = item.text().strip()
        if title:
            self.sig_renamed.emit(item.data(ID_ROLE), title)

    def _show_menu(self, point: QPoint) -> None:
        item = self.list.itemAt(point)
        if item is None:
            return
        conversation_id = item.data(ID_ROLE)
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.editItem(item))
        menu.addAction("Export as Markdown…", lambda: self.sig_export_requested.emit(conversation_id))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.sig_delete_requested.emit(conversation_id))
        menu.exec(self.list.viewport().mapToGlobal(point))
