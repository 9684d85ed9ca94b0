"""Code sent to workers by value (:mod:`aiovec._transport.by_value`): what it keeps, and
what it costs."""

from __future__ import annotations

import linecache
import tracemalloc

import numpy as np

from aiovec._transport import by_value


def test_large_captured_data_is_not_copied_twice():
    """A factory capturing a large array costs about one payload to pickle and to load,
    as plain cloudpickle does (not a second copy for the source lines)."""
    data = np.ones(20_000_000 // 8)  # 20 MB

    def factory():
        return data.sum()

    tracemalloc.start()
    try:
        blob = by_value.dumps(factory)
        _, dump_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        start, _ = tracemalloc.get_traced_memory()
        loaded = by_value.loads(blob)
        _, load_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert loaded() == data.sum()
    assert dump_peak < 1.5 * data.nbytes
    assert load_peak - start < 1.5 * data.nbytes


def test_code_keeps_its_file_and_cell_lines():
    filename = "<aiovec-by-value-cell>"
    source = "def answer():\n    return 42  # from a cell\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "__aiovec_cell__"}
    exec(compile(source, filename, "exec"), namespace)
    blob = by_value.dumps(namespace["answer"])
    del linecache.cache[filename]
    answer = by_value.loads(blob)
    assert answer() == 42
    assert answer.__code__.co_filename == filename
    assert "# from a cell" in linecache.getline(filename, 2)
    del linecache.cache[filename]
