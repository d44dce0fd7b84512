"""Vela 2.0 decoder members (0.8B, 4B, 9B): one family, every width read from the tensors' shapes."""
