"""Data shipped with the package: makemore's names.txt, the default dataset
(engine.data.DEFAULT_DATASET_PATH), with its licence in LICENSE-makemore.txt."""
