"""Decoding: what turns a backend's tokens into the text a caller sees (stop strings, where a FIM
middle ends, the suffix it must not repeat, UTF-8 held back until whole), streamed or collected."""
