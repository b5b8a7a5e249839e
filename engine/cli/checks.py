"""The headless commands' values checked before anything runs (a bad value found
after training wastes the run), and engine messages in the words of the flags
the user typed ("--steps must be ...", not "num_steps must be ...").
"""
from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

from ..config import get_preset
from ..model.sampling import check_sample_args

# The engine's names for what a flag sets: its messages are shown with the flag typed.
DEMO_FLAGS = {"num_steps": "--steps", "num_samples": "--samples", "learning_rate": "--lr",
              "init_std": "--init-std", "seed": "--seed", "temperature": "--temperature",
              "warmup_steps": "--warmup-steps", "batch_size": "--batch", "holdout": "--holdout"}
BENCH_FLAGS = {"num_samples": "--sample-names"}


def with_flags(exc: ValueError, flags: dict[str, str]) -> ValueError:
    """exc's message with the engine's field names replaced by the flags that set them."""
    message = str(exc)
    for name, flag in flags.items():
        message = re.sub(rf"(?<![\w.-]){name}\b", flag, message)
    return ValueError(message)


def demo_configs(args):
    """The preset's model and training configs with the flags applied; every value is
    checked here, before the dataset is read or anything trains."""
    try:
        preset = get_preset(args.preset)  # --steps or the preset's own (learn: 4,000)
        if args.steps is not None:
            preset = preset.with_steps(args.steps)
        overrides = {k: v for k, v in (("learning_rate", args.lr), ("init_std", args.init_std),
                                       ("seed", args.seed), ("warmup_steps", args.warmup_steps),
                                       ("batch_size", args.batch), ("holdout", args.holdout))
                     if v is not None}
        train = replace(preset.train, **overrides)
        check_sample_args(args.samples, args.temperature, train.seed)
    except ValueError as exc:
        raise with_flags(exc, DEMO_FLAGS) from None
    return preset.model, train


def check_output_file(path: Path, flag: str) -> None:
    """A file the command writes at its end: its folder must exist and take files now,
    not after minutes of measuring."""
    folder = path.parent  # "." for a bare file name
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a folder; name a file in it")
    if not folder.is_dir():
        raise ValueError(f"{flag} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: the folder {folder} is not writable")
