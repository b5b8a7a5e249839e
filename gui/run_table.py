"""The Runs tab's table: its columns (narrow headers, the status beside the
name, the dataset last: it takes the room left and is elided), a run's row as
text, the colour swatch beside a run's name, the height that shows TABLE_ROWS
runs, and the overlay's legend labels (each run's name and the settings in
which the ticked runs differ)."""
from __future__ import annotations

import math

from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import QTableWidget

from engine.training.records import RunRecord

COLUMNS = ["Run", "Status", "Preset", "Backend", "LR", "Batch", "Steps", "Smoothed loss", "Best held-out",
           "Final held-out", "ms/step", "names/s", "Dataset"]
HEADERS = {"Smoothed loss": "Smoothed\nloss", "Best held-out": "Best\nheld-out", "Final held-out": "Final\nheld-out"}
TABLE_ROWS = 6  # runs in view before the table scrolls


def row_texts(r: RunRecord, smoothed: float | None) -> list[str]:
    """The row of run r, by COLUMNS; smoothed: its last smoothed loss (None: no steps)."""
    ms, rate = r.ms_per_step, r.names_per_second
    return [r.name, r.status, r.preset, r.backend, f"{r.train.learning_rate:g}", f"{r.train.batch_size:,}",
            f"{r.steps:,}", "-" if smoothed is None else f"{smoothed:.4f}", loss_text(r.best_heldout),
            loss_text(r.final_heldout), "-" if math.isnan(ms) else f"{ms:.3g}",
            "-" if math.isnan(rate) else f"{rate:,.0f}", r.dataset or "-"]


def setting_texts(r: RunRecord) -> dict[str, str]:
    """Run r's settings as its legend label words them, by what they are."""
    m, t = r.model, r.train
    return {"preset": r.preset, "n_embd": f"n_embd {m.n_embd}", "n_layer": f"n_layer {m.n_layer}",
            "n_head": f"n_head {m.n_head}", "block_size": f"block {m.block_size}", "backend": r.backend,
            "lr": f"lr {t.learning_rate:g}", "batch": f"batch {t.batch_size:,}", "steps": f"{t.num_steps:,} steps",
            "seed": f"seed {t.seed}", "init_std": f"init std {t.init_std:g}",
            "warmup": f"warm-up {t.warmup_steps:,}", "holdout": f"{t.holdout or 0:,} held out"}


MODEL_KEYS = ("n_embd", "n_layer", "n_head", "block_size")


def legend_labels(records: list[RunRecord]) -> list[str]:
    """Each run's name and the settings in which the runs differ ("run 2: lr 0.02,
    2,000 steps"), so no two labels read the same but for the name; runs that
    differ in nothing (or a run alone) read "run 1: tiny, numpy, lr 0.01"."""
    texts = [setting_texts(r) for r in records]
    differing = [key for key in texts[0] if len({t[key] for t in texts}) > 1] if texts else []
    if "preset" in differing:  # the preset names its network: its fields would repeat it
        differing = [key for key in differing if key not in MODEL_KEYS]
    labels = []
    for r, t in zip(records, texts):
        words = [t[key] for key in differing] or [t["preset"], t["backend"], t["lr"]]
        labels.append(f"{r.name}: {', '.join(words)}")
    return labels


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
