"""The inline styles of our HTML tables' cells, shared by every table we draw (the notebook's,
notebook/markup.py, and the timeline's, parallel/timeline.py, which may not import the notebook).

A cell's alignment: text left, figures right and on one line, a table's locations ("6 cell 2:3") on
one line. Each cell carries its own as an inline style="": JupyterLab drops <style> elements from an
untrusted output (a notebook opened from disk without having been run there), and its sanitizer
keeps these three properties of a cell's style attribute; an inline style also wins over
JupyterLab's right-aligning rule, trusted or not.
"""

TEXT_CELL = "text-align:left;vertical-align:top"
FIGURE_CELL = "text-align:right;vertical-align:top;white-space:nowrap"
LOCATION_CELL = "text-align:left;vertical-align:top;white-space:nowrap"
