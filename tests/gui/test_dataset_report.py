"""What the window says about the dataset it is about to train on."""
from PySide6.QtWidgets import QLabel, QSpinBox


def test_documents_longer_than_the_block_are_reported(make_window, tmp_path):
    docs = ["ab", "abcdefghij", "abc", "abcdefgh", "a"]
    data = tmp_path / "docs.txt"
    data.write_text("\n".join(docs) + "\n", encoding="utf-8")
    window = make_window(data)
    info = window.findChild(QLabel, "datasetInfo")
    block = window.findChild(QSpinBox, "block_sizeSpin")

    block.setValue(6)
    longer = sum(len(doc) > 6 - 1 for doc in docs)
    assert longer == 2
    assert f"{longer} documents longer than 5 characters (block_size 6)" in info.text()

    block.setValue(16)  # every document fits: no note
    assert "longer than" not in info.text()
    assert f"{len(docs)} documents" in info.text()
