"""Decoding: what turns a backend's tokens into the text a caller sees.

:mod:`.sink` detokenizes (UTF-8 held back until whole), ends at stop ids, and runs the job's filters
(:mod:`.filter`) in order: stop strings (:mod:`.stops`), where a FIM middle ends (:mod:`.middle`),
the suffix it must not repeat (:mod:`.overlap`), a constraint's verdict (:mod:`.grammar`).
:mod:`.streams` hands the chunks to callers, streamed or collected.
"""
