"""microgpt's math: the forward pass, loss, hand-written backward and Adam over an
array module (gpt.py), sampling over a key/value cache, and looking inside a model."""
