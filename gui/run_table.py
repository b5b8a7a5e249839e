"""The Runs tab's table: its columns, a run's row as text, the colour swatch
beside a run's name, and the height that shows TABLE_ROWS runs."""
from __future__ import annotations

import math

from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import QTableWidget

from engine.training.records import RunRecord

COLUMNS = ["Run", "Preset", "Backend", "LR", "Batch", "Steps", "Smoothed loss", "Best held-out", "Final held-out",
           "ms/step", "names/s", "Dataset", "Status"]
TABLE_ROWS = 6  # runs in view before the table scrolls


def row_texts(r: RunRecord, smoothed: float | None) -> list[str]:
    """The row of run r, by COLUMNS; smoothed: its last smoothed loss (None: no steps)."""
    ms, rate = r.ms_per_step, r.names_per_second
    return [r.name, r.preset, r.backend, f"{r.train.learning_rate:g}", f"{r.train.batch_size:,}", f"{r.steps:,}",
            "-" if smoothed is None else f"{smoothed:.4f}", loss_text(r.best_heldout), loss_text(r.final_heldout),
            "-" if math.isnan(ms) else f"{ms:.3g}", "-" if math.isnan(rate) else f"{rate:,.0f}",
            r.dataset or "-", r.status]


def loss_text(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.4f}"


def table_height(table: QTableWidget, rows: int) -> int:
    """The height that shows the header and `rows` rows, and a horizontal scroll bar
    (the columns are wider than a narrow window)."""
    return (table.horizontalHeader().sizeHint().height() + rows * table.verticalHeader().defaultSectionSize()
            + table.horizontalScrollBar().sizeHint().height() + 2 * table.frameWidth())


def swatch(color: tuple[int, int, int]) -> QIcon:
    pixmap = QPixmap(12, 12)
    pixmap.fill(QColor(*color))
    return QIcon(pixmap)
