"""ipywidgets views of tl_lab's pieces. Each widget reads the real code path, never a copy."""
