"""Data: the corpus (documents in training order, vocabulary, token arrays), the
split into training and held-out documents with each step's padded batch, and
the packaged default dataset."""
